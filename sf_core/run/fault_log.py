"""The run's record of its faults: each component death the runner saw, what it cost, and when training went on.

training_summary.json's `faults` lists them in the order they happened, one dict each:
component (the process that died, as the runner names it: `learner_proc`, `inference_worker_0_proc`,
`learner_rank_1`), cause (the runner's line about it), at and recovered_at (Unix times, seconds; recovered_at is
None for a fault that stopped the run, or one the run ended before recovering from) and frames_lost (trained
frames the recovery discarded: 0 when the learner could save a checkpoint on the way down). The list covers this
command only: a resumed experiment starts an empty one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class Fault:
    component: str
    cause: str
    at: float
    recovered_at: float | None = None
    frames_lost: int = 0


class FaultLog:
    def __init__(self) -> None:
        self.faults: list[Fault] = []

    def add(self, component: str, cause: str, at: float) -> Fault:
        fault = Fault(component, cause, at)
        self.faults.append(fault)
        return fault

    def as_list(self) -> list[dict]:
        return [dataclasses.asdict(fault) for fault in self.faults]
