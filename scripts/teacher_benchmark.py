"""Does a teacher speed a student up? CartPole to 475 with and without --algo=APPO_TEACHER, seed by seed.

    python scripts/teacher_benchmark.py --seeds=1,2,3

Trains the teacher once (APPO, --teacher_seed, to --target), then for each seed runs plain APPO and APPO_TEACHER
with that teacher, in turns so both see the same machine (scripts/time_to_solve.py's runs). Prints each run's
frames and seconds to the target and the medians; --output writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from time_to_solve import REPO, solve_once  # noqa: E402


def median_frames(runs: list[dict]) -> float | None:
    """A run that never solved counts as the longest."""
    frames = [r["frames"] if r["solved"] else float("inf") for r in runs]
    value = statistics.median(frames) if frames else None
    return None if value in (None, float("inf")) else value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--teacher_seed", type=int, default=100)
    p.add_argument("--extra", default="", help="trainer flags for every run (teacher and students), one string")
    p.add_argument("--limit", type=float, default=120.0)
    p.add_argument("--output", default="teacher_benchmark.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sf_core_teacher_") as tmp:
        teacher = solve_once(REPO, args, args.teacher_seed, os.path.join(tmp, "teacher"))
        if not teacher["solved"]:
            print(f"the teacher did not reach {args.target:g}: {teacher.get('output_tail', '')}")
            return 1
        path = os.path.join(tmp, "teacher", f"solve_{args.teacher_seed}", "checkpoint", "best.pt")
        arms = {"APPO": args.extra, "APPO_TEACHER": f"{args.extra} --algo=APPO_TEACHER --teacher={path}"}
        runs: dict[str, list[dict]] = {name: [] for name in arms}
        for seed in (int(s) for s in args.seeds.split(",") if s.strip()):
            for name, flags in arms.items():
                run = solve_once(REPO, argparse.Namespace(**{**vars(args), "extra": flags}), seed,
                                 os.path.join(tmp, name))
                runs[name].append(run)
                print(f"{name} seed {seed}: " + (f"{run['frames']:,} frames, {run['wall_seconds']:.1f}s to exit"
                                                 if run["solved"] else "NOT solved"), flush=True)
    results = {"env": args.env, "target": args.target, "teacher": {k: teacher[k] for k in ("frames", "wall_seconds")},
               "runs": runs, "median_frames": {name: median_frames(r) for name, r in runs.items()},
               "median_wall_seconds": {name: statistics.median(x["wall_seconds"] for x in r) for name, r in runs.items()}}
    with open(args.output, "w") as f:
        json.dump(results, f, indent=2)
    for name in arms:
        frames = results["median_frames"][name]
        print(f"{name}: median {frames:,.0f} frames to {args.target:g}" if frames else f"{name}: not solved",
              f"(median {results['median_wall_seconds'][name]:.1f}s to exit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
