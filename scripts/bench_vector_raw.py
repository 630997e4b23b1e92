"""The raw ceiling of a vector env: a split's VectorEnv stepped alone, with random actions, in N processes at once.

    python scripts/bench_vector_raw.py -- --env=CartPole-v1                       # the preset's splits
    python scripts/bench_vector_raw.py -- --env=atari_pong --env_vectorization=ale

After `--`, the trainer's flags: they choose the backend and a split's size as a run would (its preset, the machine
fit, `--env_vectorization`), and each process builds one split's vector env as a rollout worker does
(envs/vector_backends.py). Prints env frames/s summed over the processes (a step of N sub-envs is N frames, times
--env_frameskip), counted over --seconds after --warmup.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STEPS_PER_CLOCK_READ = 8


def step_alone(argv: list[str], index: int, warmup: float, seconds: float, results) -> None:
    from sf_core.cli.arguments import parse_args
    from sf_core.envs.registry import VectorEnvContext, registry_snapshot
    from sf_core.envs.vector_backends import vector_backend

    cfg, _ = parse_args(argv)
    registry = registry_snapshot(only=cfg.env)
    backend = vector_backend(cfg, registry)
    if backend is None:
        results.put((index, f"no vector env serves {cfg.env} with these flags", 0.0, 0))
        return
    n = cfg.envs_per_split()
    env = backend.make(cfg.env, cfg, VectorEnvContext(index, index * n, n, None), registry)
    env.action_space.seed(index)
    actions = [env.action_space.sample() for _ in range(64)]
    env.reset(seed=index * n)
    started = time.perf_counter()
    counted, window_start, now, steps = 0, None, started, 0
    while now < started + warmup + seconds:
        for _ in range(STEPS_PER_CLOCK_READ):
            env.step(actions[steps % len(actions)])
            steps += 1
        now = time.perf_counter()
        if window_start is None and now >= started + warmup:
            window_start = now
        elif window_start is not None:
            counted += STEPS_PER_CLOCK_READ
    env.close()
    frames = counted * n * cfg.env_frameskip
    results.put((index, backend.name, frames / (now - window_start) if window_start else 0.0, n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    args, trainer_flags = parser.parse_known_args([a for a in sys.argv[1:] if a != "--"])
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=step_alone, args=(trainer_flags, i, args.warmup, args.seconds, results), daemon=True)
             for i in range(args.processes)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=args.warmup + args.seconds + 120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if any(fps == 0.0 for _, _, fps, _ in got):
        sys.exit(f"bench_vector_raw: {got}")
    _, backend, _, n = got[0]
    per = [fps for _, _, fps, _ in sorted(got)]
    print(f"{' '.join(trainer_flags)}: the {backend} backend's vector env of {n}, {args.processes} processes: "
          f"{sum(per):,.0f} env frames/s ({', '.join(f'{f:,.0f}' for f in per)})")


if __name__ == "__main__":
    main()
