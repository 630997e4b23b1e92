"""Hard exploration: APPO against APPO_RND on the corridor (`sf_core/Corridor-v0`, envs/corridor.py), per seed.

    python scripts/exploration_benchmark.py --seeds=1,2,3 --frames=1000000 --output=exploration_benchmark.json
    python scripts/exploration_benchmark.py --env=sf_core/CorridorImage-v0 --algos=APPO_RND   # seen as images

Each run is `python -m sf_core.train` with a fixed frame budget (--frames), stopping early once the mean
return of the last --stats_window episodes reaches 0.9 (`--target_mean_return`): "reached the goal". Runs go
one at a time, so each has the machine to itself. Prints a markdown table (algorithm, seed, reached the goal,
env frames when the run stopped at the goal, wall seconds from launch to exit) and writes it to --output.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from time_to_solve import REPO, solve_once  # noqa: E402

ENV = "sf_core/Corridor-v0"
TARGET = 0.9
# Both algorithms train with the same flags: only --algo differs (tests/test_rnd.py trains with them too).
TRAINER_FLAGS = ("--num_workers=2", "--num_envs_per_worker=16", "--learning_rate=1e-3",
                 "--exploration_loss_coeff=0.01", "--stats_window=50", "--encoder_mlp_layers", "64", "64")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default=ENV, help="a corridor: sf_core/Corridor-v0 or sf_core/CorridorImage-v0")
    p.add_argument("--algos", default="APPO,APPO_RND")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--frames", type=int, default=1_000_000, help="--train_for_env_steps of every run")
    p.add_argument("--limit", type=float, default=300.0, help="--train_for_seconds of every run (a safety net)")
    p.add_argument("--extra", default="", help="more trainer flags, one string")
    p.add_argument("--output", default="exploration_benchmark.json")
    return p.parse_args(argv)


def run_once(args: argparse.Namespace, algo: str, seed: int, train_dir: str) -> dict:
    """One run, launched and read as scripts/time_to_solve.py does: the target is the goal."""
    flags = shlex.join([f"--algo={algo}", f"--train_for_env_steps={args.frames}", *TRAINER_FLAGS])
    solve = argparse.Namespace(env=args.env, target=TARGET, limit=args.limit, extra=f"{flags} {args.extra}")
    run = solve_once(REPO, solve, seed, os.path.join(train_dir, algo))
    return {"algo": algo, "seed": seed, "reached_goal": run["solved"], "frames": run["frames"],
            "frames_to_goal": run["frames"] if run["solved"] else None, **run}


def table(runs: list[dict]) -> str:
    lines = ["| algo | seed | reached the goal | frames to the goal | wall seconds |",
             "| --- | --- | --- | --- | --- |"]
    for r in runs:
        frames = f"{r['frames_to_goal']:,}" if r["reached_goal"] else f"not within {r['frames'] or 0:,}"
        lines.append(f"| {r['algo']} | {r['seed']} | {'yes' if r['reached_goal'] else 'no'} | {frames} | "
                     f"{r['wall_seconds']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    runs = []
    with tempfile.TemporaryDirectory(prefix="sf_core_exploration_") as tmp:
        for algo in algos:
            for seed in seeds:
                run = run_once(args, algo, seed, tmp)
                runs.append(run)
                print(f"{algo} seed {seed}: {'reached the goal' if run['reached_goal'] else 'did not reach the goal'}"
                      f" after {run['frames'] or 0:,} frames, {run['wall_seconds']:.1f}s", flush=True)
    markdown = table(runs)
    reached = {algo: sum(r["reached_goal"] for r in runs if r["algo"] == algo) for algo in algos}
    with open(args.output, "w") as f:
        json.dump({"env": args.env, "target_mean_return": TARGET, "frames": args.frames,
                   "trainer_flags": TRAINER_FLAGS, "extra": args.extra, "runs": runs, "reached": reached,
                   "table": markdown}, f, indent=2)
    print(markdown)
    print("reached the goal: " + ", ".join(f"{algo} {n}/{len(seeds)}" for algo, n in reached.items()))
    print(f"results: {args.output}")
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1  # a run that ends at its budget exits 0 too


if __name__ == "__main__":
    sys.exit(main())
