"""Launch to solved: wall-clock seconds from `python -m sf_core.train` starting to its exit at
--target_mean_return, per seed, with the median; optionally beside another checkout's (`--baseline_repo`),
run seed by seed in turns so both see the same machine.

    python scripts/time_to_solve.py --env=CartPole-v1 --target=475 --seeds=1,2,3 --baseline_repo=/work/base

The figure is the user's: interpreter start-up, imports, training and the final checkpoint included.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(SCRIPTS)
if SCRIPTS not in sys.path:  # benchlib, however this file is run or loaded
    sys.path.insert(0, SCRIPTS)

from benchlib.checkout import checkout_env  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--target", type=float, default=475.0, help="--target_mean_return")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--extra", default="", help="more trainer flags, one string")
    p.add_argument("--limit", type=float, default=120.0, help="--train_for_seconds: a run that never solves stops")
    p.add_argument("--baseline_repo", help="another checkout, timed the same way")
    p.add_argument("--output", default="time_to_solve.json")
    return p.parse_args(argv)


def solve_once(repo: str, args: argparse.Namespace, seed: int, train_dir: str) -> dict:
    """One run: its wall clock to exit, and what its training_summary.json says of the target."""
    experiment = f"solve_{seed}"
    command = [sys.executable, "-m", "sf_core.train", f"--env={args.env}", f"--target_mean_return={args.target:g}",
               f"--seed={seed}", f"--train_for_seconds={args.limit:g}", f"--train_dir={train_dir}",
               f"--experiment={experiment}", "--restart_behavior=overwrite", *shlex.split(args.extra)]
    env = checkout_env(repo, train_dir)  # another checkout's algo/ and envs/ too, not the venv's
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=args.limit + 120)
    wall = time.perf_counter() - started
    try:
        with open(os.path.join(train_dir, experiment, "training_summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = {}
    solved = proc.returncode == 0 and summary.get("time_to_target") is not None
    return {"seed": seed, "wall_seconds": round(wall, 2), "solved": solved, "exit_code": proc.returncode,
            "time_to_target_trainer_s": summary.get("time_to_target"), "frames": summary.get("frames"),
            "time_to_first_frame_trainer_s": summary.get("time_to_first_frame"),
            "mean_return": summary.get("mean_return"), "mean_length": summary.get("mean_length"),
            "startup": summary.get("startup", {}).get("runner"), "command": shlex.join(command),
            **({} if solved else {"output_tail": (proc.stdout + proc.stderr)[-2000:]})}


def median_solved(runs: list[dict]) -> float | None:
    """The median wall clock, a run that never solved counting as the longest (so it can only raise it)."""
    if not runs:
        return None
    walls = [r["wall_seconds"] if r["solved"] else float("inf") for r in runs]
    value = statistics.median(walls)
    return None if value == float("inf") else value


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    repos = {"ours": REPO, **({"baseline": args.baseline_repo} if args.baseline_repo else {})}
    runs: dict[str, list[dict]] = {name: [] for name in repos}
    with tempfile.TemporaryDirectory(prefix="sf_core_solve_") as tmp:
        for seed in seeds:
            for name, repo in repos.items():
                run = solve_once(repo, args, seed, os.path.join(tmp, name))
                runs[name].append(run)
                print(f"{name} seed {seed}: {run['wall_seconds']:.1f}s to exit, "
                      + ("solved" if run["solved"] else f"NOT solved (exit {run['exit_code']})"), flush=True)
    results = {"env": args.env, "target": args.target, "seeds": seeds, "runs": runs, "repos": repos,
               "median_wall_seconds": {name: median_solved(r) for name, r in runs.items()}}
    medians = results["median_wall_seconds"]
    if medians.get("baseline") and medians.get("ours"):
        results["ours_vs_baseline"] = round(medians["ours"] / medians["baseline"], 3)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=2)
    for name, value in medians.items():
        print(f"{name}: median launch to {args.target:g} = " + (f"{value:.1f}s" if value else "not solved"))
    if "ours_vs_baseline" in results:
        print(f"ours/baseline time to solve: {results['ours_vs_baseline']:.2f}")
    print(f"results: {args.output}")
    return 0 if all(r["solved"] for r in runs["ours"]) else 1


if __name__ == "__main__":
    sys.exit(main())
