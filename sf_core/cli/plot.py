"""`python -m sf_core.plot --train_dir=D --experiments A B --output curves.png`: learning curves.

Reads each experiment's TensorBoard events and draws mean episode return against env frames and
against wall-clock time, every experiment on the same two axes.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from sf_core.config import ConfigError
from sf_core.arguments import _Parser

TAG = "episode/return"


def read_curve(experiment_path: str, tag: str = TAG) -> tuple[list[int], list[float], list[float]]:
    """(env frames, training seconds, value) for one scalar tag.

    Time is the run's own training time (logged as perf/training_hours), so the gap between a crash
    and a resume does not show as a flat stretch; wall time since the first point is the fallback.
    """
    import logging

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # resume purges are expected, not news

    tb = os.path.join(experiment_path, "tb")
    if not os.path.isdir(tb):
        raise ConfigError(f"no TensorBoard logs in {tb}")
    acc = EventAccumulator(tb, size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        raise ConfigError(f"{experiment_path} has no {tag!r} curve yet (no finished episode was logged)")
    events = acc.Scalars(tag)
    hours = {e.step: e.value for e in acc.Scalars("perf/training_hours")} \
        if "perf/training_hours" in acc.Tags()["scalars"] else {}
    start = events[0].wall_time
    seconds = [hours[e.step] * 3600 if e.step in hours else e.wall_time - start for e in events]
    return [e.step for e in events], seconds, [e.value for e in events]


def plot(train_dir: str, experiments: Sequence[str], output: str, tag: str = TAG) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_frames, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in experiments:
        frames, seconds, values = read_curve(os.path.join(train_dir, name), tag)
        by_frames.plot(frames, values, label=name)
        by_time.plot(seconds, values, label=name)
    by_frames.set_xlabel("env frames")
    by_time.set_xlabel("training seconds (wall clock)")
    for ax in (by_frames, by_time):
        ax.set_ylabel(tag)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{tag} — {', '.join(experiments)}")
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m sf_core.plot", description="Plot learning curves of experiments.",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--train_dir", default="train_dir", help="Root folder of experiments.")
    parser.add_argument("--experiments", nargs="+", required=True, help="Experiment names to compare.")
    parser.add_argument("--output", default="learning_curves.png", help="PNG (or SVG/PDF) file to write.")
    parser.add_argument("--tag", default=TAG, help="TensorBoard scalar to plot.")
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
        path = plot(args.train_dir, args.experiments, args.output, args.tag)
    except SystemExit as exc:
        return int(exc.code or 0)
    except ConfigError as exc:
        print(f"sf_core.plot: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
