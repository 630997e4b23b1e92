"""Time one env step of a MuJoCo id stepped in batch (--env_vectorization=mujoco, envs/mujoco_vector.py) against
gymnasium's envs stepped one by one, on this core, in turns:

    python scripts/bench_mujoco_vector.py --env=Ant-v5
    python scripts/bench_mujoco_vector.py --env=Humanoid-v5 --envs=16 --seconds=3 --rounds=3

Both step `--envs` envs with the same actions (a small random policy, clipped to the action space), resetting an
env whose episode ended, as a rollout worker's split does. Figures are µs of wall time per env step, the best of
the rounds.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

from sf_core.envs.mujoco_vector import KINDS, make_mujoco_vector_env


def per_step_us(step, envs: int, seconds: float) -> float:
    step()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step()
        calls += 1
    return (time.perf_counter() - started) / (calls * envs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="Ant-v5", choices=sorted(KINDS))
    parser.add_argument("--envs", type=int, default=16, help="envs in the batch (a split's)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds of each kind in a round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.envs
    batch = make_mujoco_vector_env(args.env, n)
    singles = [gym.make(args.env) for _ in range(n)]
    batch.reset(seed=0)
    for e, env in enumerate(singles):
        env.reset(seed=e)
    space = batch.single_action_space
    rng = np.random.default_rng(0)
    actions = [np.clip(rng.normal(0, 0.3, (n, *space.shape)), space.low, space.high).astype(space.dtype)
               for _ in range(64)]
    turn = iter(range(1 << 62))

    def step_batch() -> None:
        batch.step(actions[next(turn) % 64])

    def step_singles() -> None:
        a = actions[next(turn) % 64]
        for e, env in enumerate(singles):
            _, _, terminated, truncated, _ = env.step(a[e])
            if terminated or truncated:
                env.reset()

    kinds = {"gymnasium's envs one by one": step_singles, "stepped in batch": step_batch}
    best = {name: float("inf") for name in kinds}
    for _ in range(args.rounds):
        for name, step in kinds.items():
            best[name] = min(best[name], per_step_us(step, n, args.seconds))
    base = best["gymnasium's envs one by one"]
    print(f"{args.env}, {n} envs, µs per env step (best of {args.rounds} rounds of {args.seconds:g} s):")
    for name, us in best.items():
        print(f"  {name:28s} {us:7.1f}  ({base / us:.2f}x gymnasium's)")


if __name__ == "__main__":
    main()
