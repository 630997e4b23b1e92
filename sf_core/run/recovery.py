"""Recovery: a run that outlives the death of its learner's process, a learner rank or an inference worker.
(Under --env_fault_policy=restart an inference worker's process is replaced alone where that is safe:
sf_core/run/worker_replacement.py; this is what it falls back to.)

Such a process cannot be replaced alone: a learner or inference worker held faster-fifo queues and the shared
weights' lock, whose mutexes are not robust (a process killed inside one leaves it locked for good), and every
other component holds those same queues and that lock; a learner group cannot go on without one of its ranks.
So the runner stops what is left and restores every component from the newest
checkpoint on disk: the path of a resume (--restart_behavior=resume), within the same command, with fresh queues
and locks. Learners still alive save a checkpoint on the way down, so a dead inference worker or learner rank
costs no training; a dead learner cannot save, and the frames trained since its last checkpoint are lost (none
yet: it starts again from its initial weights). Up to --max_recoveries times per command; the next such death
stops the run, naming it.

The counters after a recovery: `frames` (env frames collected, the console's and TensorBoard's step, what
--train_for_env_steps counts) never goes back; samples trained and policy versions are those of the weights
restored, and `trained_frames_lost` counts what the rollback discarded.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from sf_core.contracts.signals import LearnerReport, Report
from sf_core.learning.group.followers import RANK_PREFIX
from sf_core.run.fault_log import RECOVERED, STOPPED, Fault, FaultLog
from sf_core.run.stats import TrainingStats

log = logging.getLogger("sf_core")

# components whose process's death the recovery handles (a learner rank is a process of its own)
RECOVERABLE = ("learner", "batcher", "inference_worker")


class Recovery:
    def __init__(self, max_recoveries: int, env_frameskip: int, available: bool):
        self.max_recoveries, self.env_frameskip = max_recoveries, env_frameskip
        self.available = available  # component processes on this machine: not --serial_mode, not --ray_address
        self.count = 0  # recoveries begun by this command
        self.trained_frames_lost = 0
        self.pending: Fault | None = None  # begun, components not restored yet
        self.restarted: Fault | None = None  # restored, training not yet going again
        self.hung: dict[int, str] = {}  # pid of a hung process this killed -> why

    def handles(self, process: str, hosted: list[str], exitcode: int | None) -> bool:
        """Whether the death of `process` (hosting the components `hosted`) is one a recovery is for: killed by a
        signal (the OOM killer, kill -9, a crash in native code). A process that exited by itself (an error it
        reported, a script without its `__main__` guard) would only do it again."""
        return self.available and exitcode is not None and exitcode < 0 and (
            process.startswith(RANK_PREFIX) or any(name.startswith(RECOVERABLE) for name in hosted))

    def kill_hung(self, topology, name: str, why: str) -> bool:
        """A learner (with its batcher) or a learner rank silent past --heartbeat_timeout: its process is killed, so
        that its death is recovered from as a killed one's is (the fault's cause says it hung: `cause_of`). False
        where no recovery would follow: the run then stops, naming it. `topology`: the run's (its `host` map)."""
        proc = topology.host.get(name)
        hosted = [c for c, p in topology.host.items() if p is proc]
        if proc is None or proc.pid is None or self.count >= self.max_recoveries or \
                not self.handles(proc.name, hosted, -9):
            return False
        if proc.pid not in self.hung:
            self.hung[proc.pid] = f"process {proc.name} (pid {proc.pid}) hung: {why}"
            log.warning("%s; killing it", self.hung[proc.pid])
            try:
                os.kill(proc.pid, signal.SIGKILL)  # stops a stopped process too (SIGSTOP)
            except ProcessLookupError:
                pass  # died meanwhile
        return True

    def cause_of(self, proc, died: str) -> str:
        """Why `proc` died: that it hung, if this killed it, else `died`."""
        return self.hung.pop(proc.pid, died) if proc.pid is not None else died

    def begin(self, process: str, cause: str, at: float, faults: FaultLog, frames: int) -> bool:
        """Records the death in `faults`; True if a recovery begins, False if --max_recoveries are spent (see
        `refusal`). `frames`: the run's frame counter."""
        spent = self.count >= self.max_recoveries
        fault = faults.record(process, cause, STOPPED if spent else RECOVERED, at, frames)
        if spent:
            return False
        self.count += 1
        self.pending = fault
        log.warning("%s: restoring every component from the newest checkpoint (recovery %d of at most %d, "
                    "--max_recoveries)", cause, self.count, self.max_recoveries)
        return True

    def refusal(self, cause: str) -> str:
        """The error that stops the run after a death `begin` refused."""
        if self.max_recoveries == 0:
            return f"{cause} (--max_recoveries=0: no recovery)"
        times = f"{self.count} time{'s' if self.count != 1 else ''}"
        return f"{cause}, and the run has recovered {times} already (--max_recoveries={self.max_recoveries})"

    def restored(self, states: list[dict | None], resume_from: list[str | None], stats: TrainingStats) -> None:
        """After every component was built again from `states` (each policy's newest checkpoint, loaded from
        `resume_from`; None: none yet): the statistics take the restored weights' counters, and what the rollback
        discarded is counted. Also after a rollout worker's restart, where the learners saved first (nothing lost)."""
        lost = 0
        for p, state in enumerate(states):
            policy = stats.policies[p]
            trained = state["samples_trained"] if state is not None else 0
            lost += max(0, policy.samples_trained - trained)
            # the runner may have dropped the last reports while stopping: the checkpoint's count is the truth
            stats.samples_trained += trained - policy.samples_trained
            policy.samples_trained, policy.version = trained, state["version"] if state is not None else 0
        stats.policy_version = max(p.version for p in stats.policies)
        fault, self.pending = self.pending, None
        if fault is None:
            return
        fault.frames_lost = lost * self.env_frameskip
        self.trained_frames_lost += fault.frames_lost
        self.restarted = fault
        for p, path in enumerate(resume_from):
            log.warning("policy %d %s", p, f"restored from {path}" if path else
                        "has no checkpoint yet: it starts again from its initial weights")
        if fault.frames_lost:
            log.warning("%s trained frames lost (trained since that checkpoint); env frames collected go on from %s",
                        f"{fault.frames_lost:,}", f"{stats.frames:,}")
        else:
            log.info("nothing trained was lost; env frames collected go on from %s", f"{stats.frames:,}")
        if stats.writer is not None:
            stats.writer.add_scalar("faults/recoveries", self.count, stats.frames)
            stats.writer.add_scalar("faults/trained_frames_lost", self.trained_frames_lost, stats.frames)

    def saw(self, report: Report, frames: int) -> None:
        """Training goes on again after a recovery once a learner reports a trained dataset."""
        if self.restarted is not None and isinstance(report, LearnerReport):
            FaultLog.recovered(self.restarted, time.time(), frames)
            log.info("training again %.1fs after %s died", self.restarted.recovered_at - self.restarted.at,
                     self.restarted.component)
            self.restarted = None

    def summary(self) -> dict:
        """training_summary.json's part: this command's recoveries and what they lost (the faults: stats.faults)."""
        return {"recoveries": self.count, "trained_frames_lost": self.trained_frames_lost}


def died(proc) -> str:
    """The runner's line about a dead process: a ComponentProcess (death_hint: its likely cause) or a learner rank's."""
    return f"process {proc.name} (pid {proc.pid}) died with exit code {proc.exitcode}" + getattr(proc, "death_hint", "")
