"""Our trainer's phases: `python -m sf_core.train`, sampling only or training, figures from its summary file.

The trainer rewrites {train_dir}/{experiment}/training_summary.json (atomically) every
--experiment_summaries_interval while it runs, with its own elapsed clock and counters, and once more
when it ends. Those snapshots are the points of the timed window: the numbers come as the trainer
holds them, with no dependence on how its console line is worded. The console still goes to the log.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex

from . import REPO
from .checkout import checkout_env
from .watch import Timing, Watch, watch_process
from .window import Point, window_rates

REPORT_INTERVAL_SEC = 1.0  # console status lines: for the log and for humans only
# Snapshot period of training_summary.json: the spacing of the window's points, as the console lines'
# was before the figures came from the file, so figures stay comparable with earlier runs
SUMMARY_INTERVAL_SEC = 1.0
SUMMARY_FILE = "training_summary.json"


def read_summary(path: str, since: float = 0.0) -> tuple[dict, float] | None:
    """The summary at `path` and when it was written (its mtime), if written at or after `since`.

    None while the file is missing (not written yet, or its experiment folder is being recreated),
    unreadable, not a JSON object, or older than `since` (a previous run's, not yet overwritten)."""
    try:
        with open(path) as f:
            written_at = os.fstat(f.fileno()).st_mtime  # of the very file read, even if replaced meanwhile
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or written_at < since:
        return None
    return summary, written_at


def snapshot_point(summary: dict) -> Point | None:
    """A running snapshot as a point on the trainer's clock.

    The final summary gives none: its clock includes the shutdown (checkpoint, joins), which would
    dilute the rate of a run that ended before its window closed."""
    if summary.get("running") is not True:
        return None
    try:
        return Point(t=float(summary["seconds"]), frames=int(summary["frames"]),
                     trained=int(summary["samples_trained"]))
    except (KeyError, TypeError, ValueError):
        return None


class SummaryPoller:
    """Turns each new snapshot of a running trainer's summary file into a point (a watch_process poller)."""

    def __init__(self, path: str):
        self.path = path
        self.last_t: float | None = None

    def __call__(self, w: Watch) -> Point | None:
        got = read_summary(self.path, since=w.wall_launched)
        if got is None:
            return None
        summary, written_at = got
        point = snapshot_point(summary)
        if point is None or (self.last_t is not None and point.t <= self.last_t):
            return None  # not a snapshot, or the one already seen
        self.last_t = point.t
        # launch -> the trainer's clock zero, plus the write's own delay (so: an upper bound). The file's
        # mtime, not the time we read it, so how often we poll does not bias it
        offset = written_at - w.wall_launched - point.t
        w.launch_offset = offset if w.launch_offset is None else min(w.launch_offset, offset)
        return point


def our_command(python: str, cfg_argv: list[str], extra: list[str], train_dir: str, experiment: str,
                sampling_only: bool, bound_seconds: float) -> list[str]:
    """The trainer's command line; the benchmark's own flags come after `extra`, so they win."""
    return [python, "-m", "sf_core.train", *cfg_argv,
            f"--train_for_seconds={bound_seconds:.0f}", "--train_for_env_steps=1000000000000",
            *extra,
            f"--sampling_only={sampling_only}", f"--report_interval={REPORT_INTERVAL_SEC:g}",
            f"--experiment_summaries_interval={SUMMARY_INTERVAL_SEC:g}",
            f"--train_dir={train_dir}", f"--experiment={experiment}", "--restart_behavior=overwrite"]


def run_ours(name: str, args: argparse.Namespace, cfg_argv: list[str], extra: list[str], work_dir: str,
             sampling_only: bool, repo: str = REPO) -> dict:
    """One phase of our trainer: run it until the window is covered, then its figures and how it ended.
    `repo`: the checkout whose sf_core runs (another commit's, for a before/after comparison)."""
    bound = args.startup_timeout + args.warmup + args.seconds + 60  # safety only: we stop it ourselves
    train_dir, experiment = os.path.join(work_dir, "train_dir"), f"bench_{name}"
    command = our_command(args.python, cfg_argv, extra, train_dir, experiment, sampling_only, bound)
    env = checkout_env(repo, work_dir, dict(os.environ, PYTHONUNBUFFERED="1"))
    summary_path = os.path.join(train_dir, experiment, SUMMARY_FILE)
    w = watch_process(command, Timing(args.warmup, args.seconds, args.startup_timeout),
                      os.path.join(work_dir, f"{name}.log"), poll=SummaryPoller(summary_path), cwd=repo, env=env,
                      echo=args.verbose)
    got = read_summary(summary_path, since=w.wall_launched)
    return our_result(w, got[0] if got else None, args.warmup, args.seconds, shlex.join(command))


def our_result(w: Watch, summary: dict | None, warmup: float, seconds: float, command: str) -> dict:
    """The phase's JSON entry from what the watch collected and the trainer's final summary."""
    rates = window_rates(w.points, w.first_frames_t, warmup, seconds)
    ttff = summary.get("time_to_first_frame") if summary else None
    expected_codes = (0, 130) if w.window_covered else (0,)
    final = summary is not None and not summary.get("running")  # a killed trainer leaves a running snapshot
    ok = "fps" in rates and w.exit_code in expected_codes and final and summary.get("error") is None
    result = {
        "status": "ok" if ok else "failed",
        "fps": rates.get("fps"),
        "samples_trained_per_s": rates.get("trained_per_s"),
        "window": rates.get("window"), "interval_fps": rates.get("interval_fps"),
        "time_to_first_frame_s": (round(w.launch_offset + ttff, 3)
                                  if ttff is not None and w.launch_offset is not None else None),
        "time_to_first_frame_trainer_s": ttff,
        "launch_to_trainer_clock_s": round(w.launch_offset, 3) if w.launch_offset is not None else None,
        "first_status_with_frames_s": w.first_frames_t,
        "exit_code": w.exit_code, "stopped_by": w.stopped_by, "wall_seconds": w.wall_seconds,
        "warmup_seconds": warmup, "timed_seconds": seconds,
        **w.memory,
        "shm_files_left_behind": len(w.shm_removed),
        "summary": summary,
        "command": command,
    }
    if w.killed:
        result["killed_after_stop"] = w.killed
    if not ok:
        result["error"] = (rates.get("error") or (summary or {}).get("error")
                           or (f"exit code {w.exit_code}" if w.exit_code not in expected_codes
                               else "no training_summary.json" if summary is None
                               else "training_summary.json still says running: the trainer never wrote its last"))
        result["output_tail"] = w.lines[-40:]
    return result
