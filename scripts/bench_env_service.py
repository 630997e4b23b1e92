#!/usr/bin/env python
"""Remote-env overhead: steps/s of an env in-process against the same env behind a local env server.

    python scripts/bench_env_service.py                      # CartPole-v1, 20k steps each
    python scripts/bench_env_service.py --env=Pendulum-v1 --steps=50000

Both loops step with the same pre-drawn random actions and reset when an episode ends. The remote loop
goes through `RemoteEnv` (a ZeroMQ request per step: JSON header plus the raw action, the raw observation
back) to `python -m sf_core.env_server` started here as a subprocess; `--pooled` adds the pool layer
(PooledEnv) the trainer uses. Prints one JSON line: steps/s both ways, the ratio and the overhead per step.
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
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import gymnasium as gym  # noqa: E402

from envs.env_pool import EnvPool, PooledEnv  # noqa: E402
from envs.remote_env import RemoteEnv  # noqa: E402


def steps_per_second(env: gym.Env, actions: list, repeats: int) -> float:
    """Best of `repeats` timed passes (the machine is shared: the best pass is the least disturbed)."""
    best = 0.0
    for r in range(repeats):
        env.reset(seed=r)
        started = time.perf_counter()
        for action in actions:
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
        best = max(best, len(actions) / (time.perf_counter() - started))
    return best


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pooled", action="store_true", help="Through PooledEnv (the trainer's path), not RemoteEnv.")
    args = p.parse_args(argv)

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
    print(json.dumps({
        "env": args.env, "steps": args.steps, "path": "PooledEnv" if args.pooled else "RemoteEnv",
        "in_process_steps_per_s": round(local_sps), "remote_steps_per_s": round(remote_sps),
        "remote_over_local": round(remote_sps / local_sps, 4),
        "overhead_us_per_step": round(1e6 / remote_sps - 1e6 / local_sps, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
