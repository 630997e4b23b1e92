"""The run's faults: each component death or hang the runner handled, what it did about it, and when the
component served again. training_summary.json lists them (`faults`, the last MAX_KEPT), and counts the
replacements (`worker_replacements`, kept across a resume with the checkpoint's counters).

A fault's component is the worker replaced alone (`rollout_worker_0`, `inference_worker_0`), or the process as the
runner names it (`learner_proc`, `inference_worker_0_proc`, `learner_rank_1`); its times are Unix seconds;
recovered_at is None for a fault that stopped the run or one the run ended before recovering from; frames_lost
counts the trained frames a recovery from a checkpoint discarded (sf_core/run/recovery.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MAX_KEPT = 1000  # a run that faults for days keeps its latest faults, and counts all of them

REPLACED, RESTARTED_ALL, STOPPED = "replaced", "restarted every component", "stopped the run"
RECOVERED = "restored every component from the newest checkpoint"


@dataclass
class Fault:
    component: str
    cause: str
    action: str  # REPLACED, RESTARTED_ALL or STOPPED
    at: float  # time.time() when the runner saw it (within a check interval, 0.25 s, of the death)
    frames: int  # the run's frame counter then
    recovered_at: float | None = None  # when the component's new process sent its first frames
    frames_meanwhile: int | None = None  # frames the other components counted between `at` and `recovered_at`
    frames_lost: int = 0  # trained frames a recovery from a checkpoint discarded

    def summary(self) -> dict:
        found = dataclasses.asdict(self)
        found["recovery_seconds"] = self.recovered_at - self.at if self.recovered_at is not None else None
        return found


class FaultLog:
    def __init__(self):
        self.faults: list[Fault] = []
        self.worker_replacements = 0  # rollout and inference worker processes replaced alone, over every session

    def record(self, component: str, cause: str, action: str, at: float, frames: int) -> Fault:
        fault = Fault(component, cause, action, at, frames)
        self.faults = [*self.faults[-(MAX_KEPT - 1):], fault]
        if action == REPLACED:
            self.worker_replacements += 1
        return fault

    @staticmethod
    def recovered(fault: Fault, at: float, frames: int) -> None:
        fault.recovered_at, fault.frames_meanwhile = at, frames - fault.frames

    def summary(self) -> dict:
        return {"worker_replacements": self.worker_replacements, "faults": [f.summary() for f in self.faults]}

    def state(self) -> dict:
        """What a checkpoint keeps: the counts (the list is this session's)."""
        return {"worker_replacements": self.worker_replacements}

    def restore(self, state: dict) -> None:
        self.worker_replacements = state.get("worker_replacements", 0)  # absent in older checkpoints

    def console(self) -> str:
        return f" | workers replaced: {self.worker_replacements}" if self.worker_replacements else ""

    def write(self, writer, step: int) -> None:
        writer.add_scalar("faults/worker_replacements", self.worker_replacements, step)
