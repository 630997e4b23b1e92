"""Where a component's time goes, and when it reached each step of its start-up.

Every component that reports timing owns a `PhaseClock`. Its slots (`@guarded`) count as busy; inside them,
the component names the phases worth telling apart (an env step, a forward pass, an SGD step). A report
splits the wall time since the previous one into those phases, `other` (the rest of its slots: signals,
bookkeeping) and `waiting` (no slot running: the component had nothing to do). In serial mode every
component shares one loop, so one component's `waiting` includes the others' work.

Start-up marks are wall-clock times (`time.time()`), each recorded once: `process_started` (when the OS
started the process, interpreter start-up and imports to come), `loop_started` (imports done, the event
loop turning), then each kind's own (envs made, model on its device, first forward, first frame...).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

WAITING, OTHER = "waiting", "other"


@dataclass
class TimingReport:
    """Seconds per phase of `component` since its previous report, counters (batches, rows), and the start-up
    marks it reached meanwhile (name -> wall-clock time)."""

    component: str
    wall: float
    seconds: dict[str, float]
    counts: dict[str, int] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)


def process_started_at() -> float:
    """When the OS started this process (wall clock, to its 10 ms ticks): Linux's /proc; elsewhere, when this
    module was imported. The process's age is read on the boot clock, which its start time counts on (the boot
    time in /proc/stat is rounded to the second: too coarse)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command's name
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


class PhaseClock:
    def __init__(self, component: str):
        self.component = component
        self.since = time.perf_counter()
        self.busy = 0.0
        self.depth = 0  # a slot calling another guarded slot counts once
        self.phases: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.marks: dict[str, float] = {}
        self.reached: set[str] = set()

    def add(self, phase: str, seconds: float) -> None:
        """`seconds` of this component's slot time went to `phase`."""
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def mark(self, name: str, at: float | None = None) -> None:
        """Start-up step `name` reached now (or `at`); only its first time counts."""
        if name not in self.reached:
            self.reached.add(name)
            self.marks[name] = time.time() if at is None else at

    def mark_started(self) -> None:
        """The first turn of the component's loop: the process was started, and every import is done."""
        self.mark("process_started", process_started_at())
        self.mark("loop_started")

    def take(self) -> TimingReport:
        """Everything since the previous take, and the clock reset for the next."""
        now = time.perf_counter()
        wall, named = now - self.since, sum(self.phases.values())
        seconds = {**self.phases, OTHER: max(0.0, self.busy - named), WAITING: max(0.0, wall - self.busy)}
        report = TimingReport(self.component, wall, seconds, self.counts, self.marks)
        self.since, self.busy, self.phases, self.counts, self.marks = now, 0.0, {}, {}, {}
        return report
