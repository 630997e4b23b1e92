"""Our trainer's phases: `python -m sf_core.train`, sampling only or training, figures from its console."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex

from . import REPO
from .watch import Timing, Watch, watch_process
from .window import Point, window_rates

REPORT_INTERVAL_SEC = 1.0  # our trainer's status lines while benchmarking

# "12:00:01 INFO [  12.3s] frames 123,456 | fps 9,876 | return ... | policy v3 lag 0.4 | trained 120,000"
OUR_STATUS = re.compile(r"\[\s*(?P<elapsed>[0-9.]+)s\] frames (?P<frames>[0-9,]+) \| fps .*?"
                        r"\| trained (?P<trained>[0-9,]+)")


def parse_ours(line: str, read_t: float, w: Watch) -> Point | None:
    """A point from one of our trainer's console status lines (None for any other line)."""
    m = OUR_STATUS.search(line)
    if not m:
        return None
    elapsed = float(m["elapsed"])
    offset = read_t - elapsed  # launch -> the trainer's clock zero, plus output delay (so: an upper bound)
    w.launch_offset = offset if w.launch_offset is None else min(w.launch_offset, offset)
    # Times on the trainer's own clock: exact intervals, whatever the pipe delays
    return Point(t=elapsed, frames=int(m["frames"].replace(",", "")), trained=int(m["trained"].replace(",", "")))


def our_command(python: str, cfg_argv: list[str], extra: list[str], train_dir: str, experiment: str,
                sampling_only: bool, bound_seconds: float) -> list[str]:
    """The trainer's command line; the benchmark's own flags come after `extra`, so they win."""
    return [python, "-m", "sf_core.train", *cfg_argv,
            f"--train_for_seconds={bound_seconds:.0f}", "--train_for_env_steps=1000000000000",
            *extra,
            f"--sampling_only={sampling_only}", f"--report_interval={REPORT_INTERVAL_SEC:g}",
            f"--train_dir={train_dir}", f"--experiment={experiment}", "--restart_behavior=overwrite"]


def run_ours(name: str, args: argparse.Namespace, cfg_argv: list[str], extra: list[str], work_dir: str,
             sampling_only: bool) -> dict:
    """One phase of our trainer: run it until the window is covered, then its figures and how it ended."""
    bound = args.startup_timeout + args.warmup + args.seconds + 60  # safety only: we stop it ourselves
    train_dir, experiment = os.path.join(work_dir, "train_dir"), f"bench_{name}"
    command = our_command(args.python, cfg_argv, extra, train_dir, experiment, sampling_only, bound)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=REPO + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    w = watch_process(command, Timing(args.warmup, args.seconds, args.startup_timeout),
                      os.path.join(work_dir, f"{name}.log"), parse_line=parse_ours, cwd=REPO, env=env,
                      echo=args.verbose)
    summary = _read_json(os.path.join(train_dir, experiment, "training_summary.json"))
    return our_result(w, summary, args.warmup, args.seconds, shlex.join(command))


def our_result(w: Watch, summary: dict | None, warmup: float, seconds: float, command: str) -> dict:
    """The phase's JSON entry from what the watch collected and the trainer's final summary."""
    rates = window_rates(w.points, w.first_frames_t, warmup, seconds)
    ttff = summary.get("time_to_first_frame") if summary else None
    expected_codes = (0, 130) if w.window_covered else (0,)
    ok = ("fps" in rates and w.exit_code in expected_codes and summary is not None
          and summary.get("error") is None)
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
                               else "no training_summary.json"))
        result["output_tail"] = w.lines[-40:]
    return result


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
