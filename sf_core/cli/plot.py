"""`python -m sf_core.plot --train_dir=D --experiments A B --output curves.png`: learning curves.

Reads each experiment's TensorBoard events and draws mean episode return against env frames and
against wall-clock time, every experiment on the same two axes. A run of several policies
(--num_policies) is drawn as one line per policy, labelled "NAME policy K".
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Sequence

from sf_core.cli import exit_process
from sf_core.cli.arguments import _Parser
from sf_core.config import ConfigError
from sf_core.records.experiment import load_config

if TYPE_CHECKING:  # both imported only when a plot is drawn
    from matplotlib.figure import Figure
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TAG = "episode/return"


def read_curve(experiment_path: str, tag: str = TAG, scalars: EventAccumulator | None = None
               ) -> tuple[list[int], list[float], list[float]]:
    """(env frames, training seconds, value) for one scalar tag (`scalars`: the experiment's events, when
    already read by `read_scalars`).

    Time is the run's own training time (logged as perf/training_hours), so the gap between a crash
    and a resume does not show as a flat stretch; wall time since the first point is the fallback.
    """
    acc = read_scalars(experiment_path) if scalars is None else scalars
    if tag not in acc.Tags()["scalars"]:
        raise ConfigError(f"{experiment_path} has no {tag!r} curve yet (no finished episode was logged)")
    events = acc.Scalars(tag)
    hours = {e.step: e.value for e in acc.Scalars("perf/training_hours")} \
        if "perf/training_hours" in acc.Tags()["scalars"] else {}
    start = events[0].wall_time
    seconds = [hours[e.step] * 3600 if e.step in hours else e.wall_time - start for e in events]
    return [e.step for e in events], seconds, [e.value for e in events]


def read_scalars(experiment_path: str) -> EventAccumulator:
    """The experiment's TensorBoard scalars (an EventAccumulator), read once for all its curves."""
    import logging

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # resume purges are expected, not news

    tb = os.path.join(experiment_path, "tb")
    if not os.path.isdir(tb):
        raise ConfigError(f"no TensorBoard logs in {tb}")
    acc = EventAccumulator(tb, size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def experiment_curves(experiment_path: str, name: str, tag: str = TAG) -> list[tuple[str, tuple]]:
    """(label, curve) to draw for one experiment: one per policy (`policy_{K}/TAG`, "NAME policy K") for
    a run of several policies that logged the tag per policy, else the one curve of TAG."""
    scalars = read_scalars(experiment_path)
    num_policies = _num_policies(experiment_path)
    per_policy = [k for k in range(num_policies) if f"policy_{k}/{tag}" in scalars.Tags()["scalars"]]
    if num_policies > 1 and per_policy:  # a policy with no finished episode yet has no line
        return [(f"{name} policy {k}", read_curve(experiment_path, f"policy_{k}/{tag}", scalars)) for k in per_policy]
    return [(name, read_curve(experiment_path, tag, scalars))]


def _num_policies(experiment_path: str) -> int:
    try:
        return load_config(experiment_path).num_policies
    except ConfigError:  # logs without config.json (copied curves): drawn as one run
        return 1


def draw(train_dir: str, experiments: Sequence[str], tag: str = TAG) -> Figure:
    """The figure: `tag` against env frames and against training time, a line per experiment (per
    policy for a run of several); its two axes hold the same lines, with the same labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_frames, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    try:
        for name in experiments:
            for label, (frames, seconds, values) in experiment_curves(os.path.join(train_dir, name), name, tag):
                by_frames.plot(frames, values, label=label)
                by_time.plot(seconds, values, label=label)
    except BaseException:
        plt.close(fig)  # pyplot keeps every open figure: a caller that goes on (push_to_hub) must not leak it
        raise
    by_frames.set_xlabel("env frames")
    by_time.set_xlabel("training seconds (wall clock)")
    for ax in (by_frames, by_time):
        ax.set_ylabel(tag)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{tag} — {', '.join(experiments)}")
    fig.tight_layout()
    return fig


def plot(train_dir: str, experiments: Sequence[str], output: str, tag: str = TAG) -> str:
    """`draw`, saved to `output`; returns its path."""
    import matplotlib.pyplot as plt

    fig = draw(train_dir, experiments, tag)
    try:
        fig.savefig(output, dpi=100)
    finally:
        plt.close(fig)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m sf_core.plot", description="Plot learning curves of experiments.",
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--train_dir", default="train_dir", help="Root folder of experiments.")
    parser.add_argument("--experiments", nargs="+", required=True, help="Experiment names to compare.")
    parser.add_argument("--output", default="learning_curves.png", help="PNG (or SVG/PDF) file to write.")
    parser.add_argument("--tag", default=TAG, help="TensorBoard scalar to plot (per policy, policy_{K}/TAG, for "
                        "a run of several policies that logs it so).")
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
    exit_process(main())
