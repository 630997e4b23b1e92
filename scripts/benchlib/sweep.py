"""--sweep: our training phase once per point of a small grid over the flags that size sampling, and the
best point for this machine and env.

The grid crosses --num_workers {cores/2, cores, 2 x cores}, --num_envs_per_worker {the resolved value,
twice that} and --policy_workers_per_policy {1, 2} from 8 cores up ({1} below: on a small machine a
second inference worker takes a core's share from the envs). --sweep_num_workers=2,4 (and
--sweep_num_envs_per_worker, --sweep_policy_workers) replace an axis. The trainer's own configuration,
run with no sweep flags, is always a point too, so "X x the trainer's defaults" is measured in the same
run, on the same machine state, rather than against a figure from another day.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from sf_core.machine.fit import FITTED, whole_splits

from .report import aligned, int_list, ratio

if TYPE_CHECKING:
    from sf_core.config import Config

SWEPT = FITTED  # the flags the trainer fits to the machine are the ones a sweep measures
OVERRIDES = {"num_workers": "sweep_num_workers", "num_envs_per_worker": "sweep_num_envs_per_worker",
             "policy_workers_per_policy": "sweep_policy_workers"}
DEFAULTS_NOTE = "the trainer's defaults"


class PhaseRunner(Protocol):
    """What the sweep and the scaling run need of scripts/benchmark.py's Benchmark."""

    results: dict
    extra: list[str]

    def phase(self, name: str, fn: Callable[[], dict], command: str | None = None,
              label: str | None = None) -> None: ...

    def ours(self, name: str, extra: list[str], sampling_only: bool) -> dict: ...


@dataclass
class SweepPoint:
    flags: dict[str, int]  # the swept flags' values, as the trainer resolves them
    defaults: bool = False  # the trainer's own configuration: run with no sweep flags at all
    rejected: str | None = None  # why the trainer's config rejects it: never run
    phase: str = ""  # its name in results["phases"]

    def argv(self) -> list[str]:
        return [] if self.defaults else flag_list(self.flags)

    def describe(self) -> str:
        return " ".join(flag_list(self.flags))


@dataclass
class SweepPlan:
    axes: dict[str, list[int]]
    points: list[SweepPoint]
    notes: list[str]  # what was adjusted or skipped, and why: printed before the first point runs


def flag_list(flags: dict[str, int]) -> list[str]:
    return [f"--{name}={flags[name]}" for name in SWEPT if name in flags]


def parse_overrides(args: argparse.Namespace) -> dict[str, list[int]]:
    """The axes given on the command line (--sweep_num_workers=2,4 ...); SystemExit on a malformed list."""
    return {name: int_list(getattr(args, option), option) for name, option in OVERRIDES.items()
            if getattr(args, option, None)}


def default_axes(base: dict[str, int], cores: int) -> dict[str, list[int]]:
    """The grid for a machine with `cores` usable cores around the resolved flags `base`."""
    envs = base["num_envs_per_worker"]
    return {"num_workers": list(dict.fromkeys(max(1, n) for n in (cores // 2, cores, 2 * cores))),
            "num_envs_per_worker": list(dict.fromkeys((envs, 2 * envs))),
            "policy_workers_per_policy": [1, 2] if cores >= 8 else [1]}


def fit_envs(values: list[int], splits: int) -> tuple[list[int], list[str]]:
    """Each env count rounded up to a multiple of --worker_num_splits (the config rejects the others:
    every split steps as many envs), duplicates dropped; and a note for each value changed."""
    fitted, notes = [], []
    for value in values:
        up = whole_splits(value, splits)
        if up != value:
            notes.append(f"--num_envs_per_worker={value} is not divisible by --worker_num_splits={splits}: "
                         f"{up} instead")
        fitted.append(up)
    return list(dict.fromkeys(fitted)), notes


def build_points(axes: dict[str, list[int]], base: dict[str, int],
                 check: Callable[[list[str]], str | None]) -> list[SweepPoint]:
    """The defaults point first, then the grid without it; `check(flags)` says why the config would
    reject a point (None: it accepts it)."""
    points = [SweepPoint(dict(base), defaults=True)]
    for values in itertools.product(*(axes[name] for name in SWEPT)):
        flags = dict(zip(SWEPT, values))
        if flags != base:  # the same configuration as the defaults point: measured once
            point = SweepPoint(flags)
            point.rejected = check(point.argv())
            points.append(point)
    for number, point in enumerate(points, 1):
        point.phase = f"sweep_{number}"
    return points


def resolve(cfg_argv: list[str], extra: list[str], flags: list[str]) -> dict[str, int] | str:
    """The swept flags as the trainer resolves the benchmark's flags plus `flags` (preset and machine
    fitting included), or the reason it rejects them."""
    from sf_core.cli.arguments import parse_args
    from sf_core.config import ConfigError

    try:
        cfg, _preset = parse_args(cfg_argv + extra + flags)
    except ConfigError as exc:
        return str(exc)
    return {name: getattr(cfg, name) for name in SWEPT}


def plan(args: argparse.Namespace, cfg: Config, cfg_argv: list[str], extra: list[str], cores: int) -> SweepPlan:
    """The grid for this run: defaults from `cores` and `cfg`, axes given on the command line instead."""
    base = {name: getattr(cfg, name) for name in SWEPT}
    axes = {**default_axes(base, cores), **parse_overrides(args)}
    axes["num_envs_per_worker"], notes = fit_envs(axes["num_envs_per_worker"], cfg.worker_num_splits)

    def check(flags: list[str]) -> str | None:
        got = resolve(cfg_argv, extra, flags)
        return got if isinstance(got, str) else None

    points = build_points(axes, base, check)
    notes += [f"{p.describe()}: skipped, the trainer rejects it: {p.rejected}" for p in points if p.rejected]
    return SweepPlan(axes, points, notes)


def run_sweep(bench: PhaseRunner, sweep: SweepPlan) -> None:
    """Each point that the config accepts, as a training phase (a failure is recorded and the next point
    runs; an interruption propagates); results["sweep"] holds every point, even after an interruption."""
    try:
        for p in sweep.points:
            if p.rejected is None:
                label = f"sf_core training {p.describe()}" + (f" ({DEFAULTS_NOTE})" if p.defaults else "")
                bench.phase(p.phase, lambda: bench.ours(p.phase, bench.extra + p.argv(), sampling_only=False),
                            label=label)
    finally:
        record(bench.results, sweep)


def record(results: dict, sweep: SweepPlan) -> None:
    results["sweep"] = entries(sweep.points, results["phases"])
    best, vs_defaults = pick_best(results["sweep"])
    results["sweep_best"] = None
    if best is not None:
        results["sweep_best"] = {"flags": best["flags"], "fps": best["fps"], "vs_defaults": vs_defaults}


def entries(points: list[SweepPoint], phases: dict) -> list[dict]:
    """One JSON entry per point: its flags, status and frames/s (None unless its phase succeeded)."""
    out = []
    for p in points:
        result = phases.get(p.phase) or {}
        status = "skipped" if p.rejected else result.get("status", "not run")
        ok = status == "ok"
        entry = {"flags": dict(p.flags), "defaults": p.defaults, "status": status,
                 "fps": result.get("fps") if ok else None,
                 "samples_trained_per_s": result.get("samples_trained_per_s") if ok else None,
                 "peak_rss_mb": result.get("peak_rss_mb"), "phase": p.phase}
        if len(result.get("fps_rounds") or ()) > 1:
            entry["fps_rounds"] = result["fps_rounds"]  # --rounds: fps is the median round's
        reason = p.rejected or result.get("error")
        if reason:
            entry["reason"] = reason
        out.append(entry)
    return out


def pick_best(points: list[dict]) -> tuple[dict | None, float | None]:
    """The point with the most frames/s, and its ratio to the defaults point (None if that one failed).
    A tie goes to the earlier point, so to the defaults: no change of flags for no gain."""
    measured = [e for e in points if e["status"] == "ok" and e["fps"]]
    if not measured:
        return None, None
    best = max(measured, key=lambda e: e["fps"])  # max keeps the first of equal ones
    defaults = next((e for e in measured if e["defaults"]), None)
    return best, ratio(best["fps"], defaults["fps"]) if defaults else None


def best_line(points: list[dict], env: str) -> str:
    best, vs_defaults = pick_best(points)
    if best is None:
        return f"no point of the sweep measured frames/s on this machine and {env}: see the failures above"
    compared = (f"{vs_defaults:.2f}× {DEFAULTS_NOTE}" if vs_defaults is not None
                else f"{DEFAULTS_NOTE} measured nothing to compare with")
    flags = " ".join(flag_list(best["flags"]))
    return f"best for this machine and {env}: {flags} ({best['fps']:,.0f} frames/s, {compared})"


def _notes(entry: dict) -> str:
    notes = [DEFAULTS_NOTE] if entry["defaults"] else []
    if entry.get("fps_rounds"):
        notes.append("median of " + ", ".join(f"{f:,.0f}" if f is not None else "-" for f in entry["fps_rounds"]))
    if entry.get("reason"):
        notes.append(entry["reason"][:60])
    return "; ".join(notes)


def report_lines(points: list[dict], env: str) -> list[str]:
    """The points sorted by frames/s (those without a figure last), then the best point on the last line."""
    defaults_fps = next((e["fps"] for e in points if e["defaults"] and e["fps"]), None)
    ranked = sorted(points, key=lambda e: -(e["fps"] or -1.0))
    head = ("workers", "envs/worker", "inference workers", "frames/s", "x defaults", "peak RSS MB", "notes")
    rows = [(e["flags"]["num_workers"], e["flags"]["num_envs_per_worker"], e["flags"]["policy_workers_per_policy"],
             f"{e['fps']:,.0f}" if e["fps"] else e["status"],
             f"{e['fps'] / defaults_fps:.2f}" if e["fps"] and defaults_fps else "",
             f"{e['peak_rss_mb']:,.0f}" if e.get("peak_rss_mb") is not None else "",
             _notes(e)) for e in ranked]
    return [*aligned(head, rows, ">>>>>><"), "", best_line(points, env)]
