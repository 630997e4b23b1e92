"""Calls at once and least-loaded slots, timed: the `composed` and `least_loaded` phases of
scripts/bench_env_service.py.

composed      three pools, one `SleepyCartPole-v1` server each (--step_ms, --parallel=True), composed by
              benchlib/composed_env.py. First a composed env's step latency in this process, calls in turn
              against calls at once, beside one call alone; then one rollout worker trains on each form
              (`python -m sf_core.train`, frames/s from its summary over the timed window).
least_loaded  two servers of unequal speed (--fast_ms, --slow_ms), --ll_slots slots each, in one pool shared
              by --runners threads; each thread leases a slot, plays a task of --task_steps steps on it and
              gives it back, as the evaluator's task runners do. Steps/s over the window with the pool's
              least-used rule and with least-loaded, on the same servers, one after the other (--rounds times).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from . import REPO
from .composed_env import POOLS, ThreeServices
from .ours import run_ours
from .service_training import Case, _stop, start_servers


def composed_phase(args: argparse.Namespace) -> list[dict]:
    procs, entries = [], {}
    try:
        for pool in POOLS:
            started, spec = start_servers(Case(pool, "SleepyCartPole-v1", 1, args.slots, True), REPO, args.work_dir,
                                          args.step_ms)
            procs += started
            entries[pool] = spec[0]
        path = os.path.join(args.work_dir, "pools.yaml")
        with open(path, "w") as f:
            f.write("pools:\n" + "".join(f"  {pool}: [{spec}]\n" for pool, spec in entries.items()))
        results = [step_latency(entries, args.latency_steps)]
        scripts = os.path.join(REPO, "scripts")  # benchlib.composed_env, for the trainer and its workers
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [scripts, os.environ.get("PYTHONPATH")]))
        for env in ("ThreeServicesInTurn-v1", "ThreeServices-v1"):
            flags = [f"--env={env}", f"--env_service={path}", "--env_module=benchlib.composed_env", "--num_workers=1"]
            result = run_ours(f"composed_{env}", args, flags, [], args.work_dir, sampling_only=False)
            results.append({"case": "composed_training", "env": env, "fps": result.get("fps"),
                            "status": result["status"], "error": result.get("error"),
                            "command": result["command"]})
    finally:
        _stop(procs)
    return results


def step_latency(entries: dict[str, str], steps: int) -> dict:
    """Milliseconds per step (median, 90th percentile) of one call alone, and of the composed env's step
    with its three calls in turn and at once, on one slot of each pool."""
    from sf_core.service.env_pool import EnvPool
    from sf_core.service.service_set import PoolGroup, ServiceSet

    group = PoolGroup({pool: EnvPool([(spec.rsplit("*", 1)[0], 0)], None) for pool, spec in entries.items()})
    services = ServiceSet(group)
    services.acquire(5.0)
    times = {}
    try:
        driver = services.envs["driver"]
        for name, env in (("one_call", driver), ("in_turn", ThreeServices(services.envs, False)),
                          ("at_once", ThreeServices(services.envs, True))):
            env.reset(seed=0)
            times[name] = []
            for n in range(steps):
                started = time.perf_counter()
                _, _, terminated, truncated, _ = env.step(n % 2)
                times[name].append(1000 * (time.perf_counter() - started))
                if terminated or truncated:
                    env.reset()
    finally:
        services.let_go()
        group.close()
    ms = {name: {"median_ms": round(statistics.median(t), 2),
                 "p90_ms": round(statistics.quantiles(t, n=10)[-1], 2)} for name, t in times.items()}
    one = ms["one_call"]["median_ms"]
    return {"case": "composed_step_latency", "steps": steps, **ms,
            "in_turn_over_one_call": round(ms["in_turn"]["median_ms"] / one, 2),
            "at_once_over_one_call": round(ms["at_once"]["median_ms"] / one, 2)}


def least_loaded_phase(args: argparse.Namespace) -> list[dict]:
    from sf_core.service.slot_choice import LeastLoaded, LeastUsed

    procs, slots = [], []
    try:
        for name, step_ms in (("fast", args.fast_ms), ("slow", args.slow_ms)):
            started, spec = start_servers(Case(name, "SleepyCartPole-v1", 1, args.ll_slots, True), REPO,
                                          args.work_dir, step_ms)
            procs += started
            address = spec[0].rsplit("*", 1)[0]
            slots += [(address, i) for i in range(args.ll_slots)]
        fast = slots[0][0]
        results = []
        for _ in range(args.rounds):
            for rule, choice in (("least_used", LeastUsed()), ("least_loaded", LeastLoaded())):
                results.append({"case": "unequal_servers", "rule": rule,
                                **shared_pool_rate(slots, choice, fast, args)})
    finally:
        _stop(procs)
    return results


def shared_pool_rate(slots: list[tuple[str, int]], choice, fast: str, args: argparse.Namespace) -> dict:
    """Steps/s of --runners threads leasing slots of one pool for tasks of --task_steps steps, over
    --seconds after --warmup; and the share of the steps the fast server took."""
    from sf_core.service.env_pool import EnvPool
    from sf_core.service.pooled_env import PooledEnv

    pool = EnvPool(slots, "SleepyCartPole-v1", choice=choice)
    stop = threading.Event()
    counts = [{"fast": 0, "all": 0} for _ in range(args.runners)]

    def runner(n: int) -> None:
        env = PooledEnv(pool, acquire_timeout=10.0)
        while not stop.is_set():
            env.reset()
            on_fast = env.slot.address == fast
            for k in range(args.task_steps):
                _, _, terminated, truncated, _ = env.step(k % 2)
                counts[n]["all"] += 1
                counts[n]["fast"] += on_fast
                if terminated or truncated:
                    env.reset()
            env.close()

    threads = [threading.Thread(target=runner, args=(n,), daemon=True) for n in range(args.runners)]
    for thread in threads:
        thread.start()
    time.sleep(args.warmup)
    before = [dict(c) for c in counts]
    time.sleep(args.seconds)
    after = [dict(c) for c in counts]
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    pool.close()
    steps = sum(a["all"] - b["all"] for a, b in zip(after, before))
    on_fast = sum(a["fast"] - b["fast"] for a, b in zip(after, before))
    return {"steps_per_s": round(steps / args.seconds, 1), "fast_server_share": round(on_fast / max(1, steps), 3)}
