#!/usr/bin/env python
"""Env services, measured. Two phases:

    python scripts/bench_env_service.py                      # overhead: CartPole-v1, 20k steps each
    python scripts/bench_env_service.py --env=Pendulum-v1 --steps=50000
    python scripts/bench_env_service.py --phase=training [--baseline_repo=../base]   # training on services
    python scripts/bench_env_service.py --phase=composed       # three services per step: in turn, at once
    python scripts/bench_env_service.py --phase=least_loaded   # servers of unequal speed: slot choice rules

`--phase=training` trains one rollout worker on env servers for each case of benchlib/service_training.py:
4 slots of a simulator whose step takes --step_ms (20) on one --parallel=True server, 8 such slots over
2 servers, and plain CartPole on 4 slots. With --baseline_repo, the same cases run from that checkout
too (its own servers and trainer), one after the other in the same run, and the ratios are printed.

`--phase=composed` and `--phase=least_loaded` are described in benchlib/service_calls.py.

The overhead phase:

Both loops step with the same pre-drawn random actions and reset when an episode ends. The remote loop
goes through `RemoteEnv` (a ZeroMQ request per step: JSON header plus the raw action, the raw observation
back) to `python -m sf_core.env_server` started here as a subprocess; `--pooled` adds the pool layer
(PooledEnv) the trainer uses. A ZeroMQ REQ/REP echo of a step-sized message (no JSON, no env) measures the
transport alone. Prints one JSON line: steps/s of each (best and median of --repeats passes), the ratio
and the overhead per step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (REPO, os.path.join(REPO, "scripts")):
    if path not in sys.path:
        sys.path.insert(0, path)

import multiprocessing  # noqa: E402
import statistics  # noqa: E402

import gymnasium as gym  # noqa: E402
import zmq  # noqa: E402

from sf_core.cli.arguments import add_bool_argument  # noqa: E402
from sf_core.service.env_pool import EnvPool  # noqa: E402
from sf_core.service.pooled_env import PooledEnv  # noqa: E402
from sf_core.service.remote_env import RemoteEnv  # noqa: E402


def steps_per_second(env: gym.Env, actions: list, repeats: int) -> list[float]:
    """Steps/s of each of `repeats` timed passes (the machine is shared: passes differ)."""
    rates = []
    for r in range(repeats):
        env.reset(seed=r)
        started = time.perf_counter()
        for action in actions:
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
        rates.append(len(actions) / (time.perf_counter() - started))
    return rates


def _echo(port: int) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.REP)
    sock.bind(f"tcp://127.0.0.1:{port}")
    while (message := sock.recv_multipart())[0] != b"quit":
        sock.send_multipart(message)
    sock.send(b"")


def echo_round_trips_per_second(n: int, repeats: int) -> list[float]:
    """The transport alone: a ZeroMQ REQ/REP echo of a step-sized message, no JSON, no env."""
    probe = zmq.Context().socket(zmq.REQ)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(0)
    server = multiprocessing.get_context("spawn").Process(target=_echo, args=(port,))
    server.start()
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.connect(f"tcp://127.0.0.1:{port}")
    message = [b'{"cmd": "step", "slot": 0, "arrays": [{"dtype": "<i8", "shape": []}]}', bytes(8)]
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(n):
            sock.send_multipart(message)
            sock.recv_multipart()
        rates.append(n / (time.perf_counter() - started))
    sock.send(b"quit")
    sock.recv()
    sock.close(0)
    server.join(timeout=10)
    return rates


def start_server(env: str) -> tuple[subprocess.Popen, int, str]:
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "sf_core.env_server", f"--env={env}", "--port=0", "--capacity=1"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    deadline = time.time() + 60
    while time.time() < deadline:
        text = open(log.name).read()
        if "serving" in text:
            return proc, int(text.split("tcp://")[1].split()[0].rsplit(":", 1)[1]), log.name
        if proc.poll() is not None:
            raise RuntimeError(f"env server exited: {text}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("env server did not start in 60 s")


def training_phase(args: argparse.Namespace) -> int:
    from benchlib.service_training import CASES, run_case

    args.python, args.verbose = sys.executable, False
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_env_service_") as work_dir:
        args.work_dir = work_dir
        for name in args.cases.split(","):
            results.append(run_case(CASES[name], args, REPO, "ours"))
            if args.baseline_repo:
                results.append(run_case(CASES[name], args, os.path.abspath(args.baseline_repo), "baseline"))
    for r in results:
        print(json.dumps(r))
    if args.baseline_repo:
        fps = {(r["case"], r["build"]): r["fps"] for r in results}
        for name in args.cases.split(","):
            ours, base = fps.get((name, "ours")), fps.get((name, "baseline"))
            if ours and base:
                print(f"{name}: ours {ours:,.0f} frames/s, baseline {base:,.0f} frames/s, ratio {ours / base:.2f}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


def service_calls_phase(args: argparse.Namespace) -> int:
    from benchlib.service_calls import composed_phase, least_loaded_phase

    args.python, args.verbose = sys.executable, False
    with tempfile.TemporaryDirectory(prefix="bench_env_service_") as work_dir:
        args.work_dir = work_dir
        results = composed_phase(args) if args.phase == "composed" else least_loaded_phase(args)
    for r in results:
        print(json.dumps(r))
    if args.phase == "composed":
        fps = {r["env"]: r["fps"] for r in results if r["case"] == "composed_training"}
        if all(fps.values()):
            print(f"training: at once {fps['ThreeServices-v1']:,.1f} frames/s, in turn "
                  f"{fps['ThreeServicesInTurn-v1']:,.1f} frames/s, ratio "
                  f"{fps['ThreeServices-v1'] / fps['ThreeServicesInTurn-v1']:.2f}")
        return 0 if all(r.get("status", "ok") == "ok" for r in results) else 1
    for used, loaded in zip(results[::2], results[1::2]):
        print(f"least-loaded {loaded['steps_per_s']:,.1f} steps/s, least-used {used['steps_per_s']:,.1f} steps/s, "
              f"ratio {loaded['steps_per_s'] / used['steps_per_s']:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=("overhead", "training", "composed", "least_loaded"), default="overhead")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=5)
    add_bool_argument(p, "pooled", False, "Through PooledEnv (the trainer's path), not RemoteEnv.")
    p.add_argument("--cases", default="slow_4_slots,slow_8_slots_2_servers,cartpole_4_slots",
                   help="training phase: which cases (benchlib/service_training.py)")
    p.add_argument("--step_ms", type=float, default=20.0, help="training, composed: the slow env's step time")
    p.add_argument("--baseline_repo", default="", help="training phase: another checkout, run in the same run")
    p.add_argument("--seconds", type=float, default=20.0, help="training, composed, least_loaded: timed window")
    p.add_argument("--warmup", type=float, default=5.0, help="training, composed, least_loaded: before the window")
    p.add_argument("--startup_timeout", type=float, default=90.0)
    p.add_argument("--slots", type=int, default=4, help="composed: slots per pool (the trainer's envs)")
    p.add_argument("--latency_steps", type=int, default=200, help="composed: steps timed per form")
    p.add_argument("--fast_ms", type=float, default=10.0, help="least_loaded: the fast server's step time")
    p.add_argument("--slow_ms", type=float, default=40.0, help="least_loaded: the slow server's step time")
    p.add_argument("--ll_slots", type=int, default=2, help="least_loaded: slots per server")
    p.add_argument("--runners", type=int, default=2, help="least_loaded: threads sharing the pool")
    p.add_argument("--task_steps", type=int, default=20, help="least_loaded: steps per lease of a slot")
    p.add_argument("--rounds", type=int, default=1, help="least_loaded: each rule this many times, alternating")
    args = p.parse_args(argv)
    if args.phase == "training":
        return training_phase(args)
    if args.phase in ("composed", "least_loaded"):
        return service_calls_phase(args)
    return overhead_phase(args)


def overhead_phase(args: argparse.Namespace) -> int:
    """One env in process against the same env behind a server, and the bare transport's round trips."""
    local = gym.make(args.env)
    local.action_space.seed(0)
    actions = [local.action_space.sample() for _ in range(args.steps)]
    local_sps = steps_per_second(local, actions, args.repeats)
    local.close()

    proc, port, log = start_server(args.env)
    try:
        if args.pooled:
            pool = EnvPool([(f"127.0.0.1:{port}", 0)], args.env)
            remote: gym.Env = PooledEnv(pool, acquire_timeout=5.0)
        else:
            remote = RemoteEnv(f"127.0.0.1:{port}")
        remote_sps = steps_per_second(remote, actions, args.repeats)
        remote.close()
        if args.pooled:
            pool.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        os.unlink(log)
    echo = echo_round_trips_per_second(args.steps, args.repeats)
    # best pass (least disturbed by other processes) and median pass of each
    best = {"local": max(local_sps), "remote": max(remote_sps), "echo": max(echo)}
    median = {"local": statistics.median(local_sps), "remote": statistics.median(remote_sps),
              "echo": statistics.median(echo)}
    print(json.dumps({
        "env": args.env, "steps": args.steps, "repeats": args.repeats,
        "path": "PooledEnv" if args.pooled else "RemoteEnv", "load_average_1min": os.getloadavg()[0],
        **{f"{k}_{name}": round(v[key]) for k, v in (("best", best), ("median", median))
           for key, name in (("local", "in_process_steps_per_s"), ("remote", "remote_steps_per_s"),
                             ("echo", "zmq_echo_round_trips_per_s"))},
        "best_remote_over_local": round(best["remote"] / best["local"], 4),
        "best_overhead_us_per_step": round(1e6 / best["remote"] - 1e6 / best["local"], 1),
        "median_overhead_us_per_step": round(1e6 / median["remote"] - 1e6 / median["local"], 1),
        "best_transport_us_per_step": round(1e6 / best["echo"], 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
