"""Where the run's time went, per kind of component, and its start-up timeline: from the components'
`TimingReport`s (sf_core/contracts/timing.py), for training_summary.json and the console."""

from __future__ import annotations

import re

from sf_core.contracts.timing import OTHER, WAITING, TimingReport, process_started_at

# phases in the order work flows; any other phase a component names follows them
PHASE_ORDER = ("start_up", "env_step", "load_weights", "gather_to_device", "forward", "to_host", "scatter", "copy",
               "offload_copy", "sgd", "publish_weights", OTHER, WAITING)
KIND_ORDER = ("rollout_worker", "inference_worker", "batcher", "learner")
MARK_ORDER = ("process_started", "loop_started", "envs_made", "model_on_device", "model_ready", "first_forward",
              "first_step", "first_sgd")


def kind_of(component: str) -> str:
    """rollout_worker_3 -> rollout_worker; inference_worker_p1_0 -> inference_worker (policies together)."""
    return re.sub(r"(_p\d+)?(_\d+)?$", "", component)


def _ordered(keys, order: tuple[str, ...]) -> list[str]:
    rank = {k: i for i, k in enumerate(order)}
    return sorted(keys, key=lambda k: (rank.get(k, len(order)), k))


class KindTotals:
    def __init__(self):
        self.components: set[str] = set()
        self.wall = 0.0
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, report: TimingReport) -> None:
        self.components.add(report.component)
        self.wall += report.wall
        for phase, s in report.seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + s
        for name, n in report.counts.items():
            self.counts[name] = self.counts.get(name, 0) + n

    def summary(self) -> dict:
        phases = _ordered(self.seconds, PHASE_ORDER)
        found = {"components": len(self.components), "wall_seconds": round(self.wall, 3),
                 "seconds": {p: round(self.seconds[p], 3) for p in phases},
                 "shares": {p: round(self.seconds[p] / self.wall, 4) if self.wall > 0 else 0.0 for p in phases},
                 "counts": dict(self.counts)}
        if self.counts.get("batches"):
            found["mean_batch_rows"] = round(self.counts.get("rows", 0) / self.counts["batches"], 1)
        return found


class TimeAccounting:
    def __init__(self, launched_at: float | None = None):
        self.launched_at = process_started_at() if launched_at is None else launched_at
        self.kinds: dict[str, KindTotals] = {}
        self.marks: dict[str, dict[str, float]] = {}  # component -> start-up mark -> wall clock
        self.runner_marks: dict[str, float] = {}

    def add(self, report: TimingReport) -> None:
        self.kinds.setdefault(kind_of(report.component), KindTotals()).add(report)
        if report.marks:
            self.marks.setdefault(report.component, {}).update(report.marks)

    def mark(self, name: str, at: float) -> None:
        """A moment of the runner's own (started, first frame)."""
        self.runner_marks.setdefault(name, at)

    def startup(self) -> dict:
        """Seconds after launch: every component's marks, and the latest of each kind (its critical path)."""
        since = lambda t: round(t - self.launched_at, 3)  # noqa: E731
        components = {c: {m: since(t) for m, t in marks.items()} for c, marks in sorted(self.marks.items())}
        by_kind: dict[str, dict[str, float]] = {}
        for component, marks in components.items():
            latest = by_kind.setdefault(kind_of(component), {})
            for m, s in marks.items():
                latest[m] = max(latest.get(m, s), s)
        by_kind = {k: {m: v[m] for m in _ordered(v, MARK_ORDER)} for k, v in by_kind.items()}
        return {"runner": {m: since(t) for m, t in self.runner_marks.items()}, "latest_by_kind": by_kind,
                "components": components}

    def summary(self) -> dict:
        return {kind: self.kinds[kind].summary() for kind in _ordered(self.kinds, KIND_ORDER)}

    def lines(self) -> list[str]:
        """The console's account: a line per kind of component, then the start-up timeline."""
        return accounting_lines(self.summary(), self.startup())


def accounting_lines(accounting: dict, startup: dict) -> list[str]:
    """Readable lines from training_summary.json's `time_accounting` and `startup` (the benchmark prints these
    too, from a results file)."""
    lines = ["where the time went (share of each kind's wall time, its components together):"]
    for kind, k in accounting.items():
        shares = ", ".join(f"{phase} {share:.0%}" for phase, share in k["shares"].items())
        batches = (f"; {k['counts']['batches']:,} batches of {k['mean_batch_rows']:g} rows on average"
                   if "mean_batch_rows" in k else "")
        lines.append(f"  {kind} x{k['components']}: {shares}{batches}")
    runner = startup.get("runner", {})
    steps = [f"{m} {s:.2f}" for m, s in runner.items()]
    for kind in _ordered(startup.get("latest_by_kind", {}), KIND_ORDER):
        marks = startup["latest_by_kind"][kind]
        steps.append(f"{kind}: " + ", ".join(f"{m} {s:.2f}" for m, s in marks.items()))
    lines.append("start-up, seconds after launch (the latest component of each kind): " + "; ".join(steps))
    return lines
