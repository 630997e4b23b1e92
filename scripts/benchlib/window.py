"""The timed window: a trainer's progress reports reduced to frames/s and samples trained/s.

A trainer reports its progress every so often (ours in training_summary.json, Sample Factory in a
console line); each report is a Point. The window excludes start-up and warm-up, and its edges are
reports, so the figures are differences of the trainer's own counters over the trainer's own clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW_TOLERANCE_SEC = 0.05  # a report this early still ends the timed window


@dataclass
class Point:
    """One progress report of a trainer."""

    t: float  # seconds since launch of the subprocess (on the trainer's own clock where it reports one)
    frames: int
    trained: int
    samples: int | None = None  # Sample Factory: samples collected (its "Samples:")


def window_rates(points: list[Point], first_t: float | None, warmup: float, seconds: float) -> dict:
    """Frames/s and trained/s from the first point at or after first_t + warmup (the window's start) to
    the first point `seconds` later (the one the run was stopped on), or to the last point of all if the
    run ended early."""
    if first_t is None:
        return {"error": "no status report with frames > 0"}
    inside = [p for p in points if p.t >= first_t + warmup - 1e-9]
    if len(inside) < 2:
        return {"error": f"fewer than 2 status reports after the warm-up ({len(inside)})"}
    first = inside[0]
    end_t = first.t + seconds - WINDOW_TOLERANCE_SEC
    last = next((p for p in inside[1:] if p.t >= end_t), inside[-1])
    dt = last.t - first.t
    if dt <= 0:
        return {"error": "empty window"}
    used = [p for p in inside if first.t <= p.t <= last.t]
    rates = [(b.frames - a.frames) / (b.t - a.t) for a, b in zip(used, used[1:]) if b.t > a.t]
    return {
        "fps": (last.frames - first.frames) / dt,
        "trained_per_s": (last.trained - first.trained) / dt,
        # "status_lines" predates the summary-file reports; the key stays for existing result readers
        "window": {"start_s": round(first.t, 3), "end_s": round(last.t, 3), "seconds": round(dt, 3),
                   "frames": last.frames - first.frames, "trained": last.trained - first.trained,
                   "status_lines": len(used), "complete": last.t >= end_t},
        "interval_fps": {"min": round(min(rates), 1), "max": round(max(rates), 1),
                         "cv": round(_cv(rates), 3)} if rates else None,
    }


def samples_rate(points: list[Point], window: dict) -> float | None:
    """Samples collected per second over `window` (Sample Factory's "Samples:"), where reported."""
    pts = [p for p in points if window["start_s"] - 1e-6 <= p.t <= window["end_s"] + 1e-6]
    if len(pts) < 2 or pts[-1].t <= pts[0].t or pts[0].samples is None or pts[-1].samples is None:
        return None
    return (pts[-1].samples - pts[0].samples) / (pts[-1].t - pts[0].t)


def _cv(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean if mean else float("nan")
