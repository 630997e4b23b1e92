"""Replacing a dead or hung rollout worker alone (--env_fault_policy=restart; docs/faults.md).

A rollout worker's process that dies (a segfault in an env's C library, the kernel's OOM killer, kill -9) or
hangs (no heartbeat for --heartbeat_timeout: an env step that never returns, SIGSTOP; it is killed first) is
started again with the same index while every other process goes on. What makes that safe:
- Its routing. The new process runs the components the runner built before any process started (the runner's
  copy never ran them), on the same faster-fifo queue, in the same start method. Every other process's
  connection to it still reaches it: nothing is reconnected.
- Its trajectory slots. The slots its predecessor had sent to a batcher stay held until the batcher frees them
  (sf_core/contracts/slot_holds.py); every other slot it starts afresh, from row 0, so a half-written trajectory
  is written over and never reaches a batcher (only a finished one is ever sent).
- Its requests. Its incarnation goes up before it starts (sf_core/contracts/control.py). Inference workers drop the
  requests of an earlier one still queued, and it ignores the answers to its predecessor's requests, so no stale
  action is stepped and no stale write lands in a row it fills.
- Weights: a rollout worker holds none; inference workers act for it with the current ones, and write each
  row's policy version.
Its envs are made again with seeds of their own. The frames and episodes it had reported stay counted; those of
its last quarter second, and its episodes in progress, are lost.

What a replacement cannot survive: faster-fifo's queue mutex is not robust, so a process killed inside a put or
get leaves that queue locked for good, and any process that touches it next blocks forever. Before replacing, the
runner enters each queue the dead worker read or wrote, each for at most QUEUE_PROBE_SEC on a thread of its own
(`Routing.locked_queues`; never blocking the runner). If one stays locked, the run falls back to restarting every
component from a fresh checkpoint, with new queues (at most MAX_WORKER_RESTARTS times). A component that blocked
on such a queue before that stops heartbeating, and is handled as a hung one: a rollout worker is killed and goes
the same way; any other stops the run, naming it.
"""

from __future__ import annotations

import logging
import os
import signal
from collections import deque
from dataclasses import dataclass

from sf_core.config import Config
from sf_core.contracts.component import Routing
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.signals import Report, RolloutReport
from sf_core.machine.wiring import Topology
from sf_core.run.fault_log import REPLACED, RESTARTED_ALL, STOPPED, Fault
from sf_core.run.stats import TrainingStats
from sf_core.sampling.rollout_worker import RolloutWorker

log = logging.getLogger("sf_core")

QUEUE_PROBE_SEC = 1.0  # a queue a put cannot enter this long is held by a dead process
KILL_GRACE_SEC = 5.0  # after a hung worker is killed, other silent components are given this long to wake up
RESTART_ALL, STOP = "restart all", "stop"
MAX_WORKER_RESTARTS = 5  # full restarts of a run, when a worker cannot be replaced alone


@dataclass
class Verdict:
    action: str  # REPLACED; RESTART_ALL: every component restarts from a fresh checkpoint; STOP: the run stops
    message: str


class WorkerReplacement:
    def __init__(self, enabled: bool, limit: int, window: float, heartbeat_timeout: float, restart_policy: bool):
        self.restart_policy = restart_policy  # --env_fault_policy=restart
        self.enabled, self.limit, self.window, self.heartbeat_timeout = enabled, limit, window, heartbeat_timeout
        self.replaced_at: dict[str, deque[float]] = {}  # worker -> when it was replaced, within the window
        self.killed: dict[int, tuple[str, float]] = {}  # pid of a hung worker killed -> (why, when)
        # worker index -> its fault, and the incarnation of its new process in the topology's control block then
        # (None: every component restarts; any report from a later topology's is its new process's)
        self.recovering: dict[int, tuple[Fault, int | None, ControlBlock | None]] = {}

    @classmethod
    def for_run(cls, cfg: Config, serial: bool) -> "WorkerReplacement":
        """Serial mode has no worker process to replace: a dead one is the whole run."""
        return cls(cfg.env_fault_policy == "restart" and not serial, cfg.max_worker_replacements,
                   cfg.worker_replacement_window, cfg.heartbeat_timeout, cfg.env_fault_policy == "restart")

    def on_death(self, proc, died: str, topology: Topology, stats: TrainingStats, now: float,
                 running: bool) -> Verdict:
        """What to do now that `proc` is dead (`died` says how): replace it alone, restart every component
        or stop the run. `running`: no stop condition was met yet."""
        can_restart_all = running and self.may_restart_all(proc, topology, stats)
        worker = getattr(proc, "reporter", None)
        if not self.enabled or not isinstance(worker, RolloutWorker):
            return Verdict(RESTART_ALL, _count_restart(stats, died)) if can_restart_all else Verdict(STOP, died)
        cause = self.killed.pop(proc.pid, (died, now))[0]
        times = self.replaced_at.setdefault(worker.name, deque())
        while times and now - times[0] > self.window:
            times.popleft()
        if len(times) >= self.limit:
            return self._not_alone(worker, topology, stats, now, STOP, (
                f"{cause}; it was already replaced {len(times)} times within {self.window:g}s "
                f"(--max_worker_replacements={self.limit}, --worker_replacement_window={self.window:g})"))
        locked = Routing.locked_queues(worker, QUEUE_PROBE_SEC)
        if locked:
            return self._not_alone(worker, topology, stats, now, RESTART_ALL if can_restart_all else STOP, (
                f"{cause}; the signal queue of {', '.join(locked)} stays locked (the process died inside a put or "
                f"get): it cannot be replaced alone"))
        incarnation = self._restart(proc, worker, topology)
        times.append(now)
        fault = stats.faults.record(worker.name, cause, REPLACED, now, stats.frames)
        self.recovering[worker.worker] = (fault, incarnation, topology.control)
        log.warning("%s: %s; --env_fault_policy=restart: replacing it alone (replacement %d of this worker within "
                    "%gs; at most %d: --max_worker_replacements)", worker.name, cause, len(times), self.window,
                    self.limit)
        return Verdict(REPLACED, cause)

    def may_restart_all(self, dead, topology: Topology, stats: TrainingStats) -> bool:
        """Every component may restart after `dead`'s death: only a rollout worker's, while the learners can save."""
        learners = [topology.host.get(learner.name) for learner in topology.learners]
        return (self.restart_policy and dead.name.startswith("rollout_worker_")
                and all(p is not None and p.is_alive() for p in learners) and stats.worker_restarts < MAX_WORKER_RESTARTS)

    def _not_alone(self, worker: RolloutWorker, topology: Topology, stats: TrainingStats, now: float, action: str,
                   why: str) -> Verdict:
        """The worker is not replaced alone: every component restarts (RESTART_ALL), or the run stops."""
        fault = stats.faults.record(worker.name, why, RESTARTED_ALL if action == RESTART_ALL else STOPPED, now,
                                    stats.frames)
        if action == RESTART_ALL:
            self.recovering[worker.worker] = (fault, None, topology.control)
            _count_restart(stats, why)
        return Verdict(action, why)

    @staticmethod
    def _restart(proc, worker: RolloutWorker, topology: Topology) -> int:
        """A new process for `worker`: a new incarnation (before it can send a request) and a fresh heartbeat.
        Returns the incarnation."""
        control = topology.control
        assert control is not None and control.heartbeats is not None, "async mode has a control block"
        incarnation = control.next_incarnation(worker.worker)
        control.heartbeats.restart(worker.name)
        Routing.poll_only(proc.event_loop)  # the dead process may have been waiting on it (PollingQueue says why)
        proc.renew()
        proc.start()
        return incarnation

    def kill_hung(self, topology: Topology, now: float) -> list[tuple[str, float, str]]:
        """Kill every hung rollout worker (its death is then handled by `on_death`); the components silent for
        longer than --heartbeat_timeout left to the runner (`Heartbeats.stalled`'s). None while a worker killed
        moments ago is not replaced yet: a component blocked behind it may wake up."""
        heartbeats = topology.control.heartbeats if topology.control is not None else None
        left: list[tuple[str, float, str]] = []
        for name, silent, activity in heartbeats.stalled(self.heartbeat_timeout, now) if heartbeats else ():
            proc = topology.host.get(name)
            if not self.enabled or not isinstance(getattr(proc, "reporter", None), RolloutWorker):
                left.append((name, silent, activity))
                continue
            if proc is None or proc.pid is None or proc.pid in self.killed:
                continue
            why = (f"process {proc.name} (pid {proc.pid}) hung: no heartbeat for {silent:.0f}s (--heartbeat_timeout="
                   f"{self.heartbeat_timeout:g}); its last activity: {activity}")
            log.warning("%s: %s; killing it", name, why)
            self.killed[proc.pid] = (why, now)
            try:
                os.kill(proc.pid, signal.SIGKILL)  # stops a stopped process too (SIGSTOP)
            except ProcessLookupError:
                pass  # died meanwhile
        if any(now - at < KILL_GRACE_SEC for _, at in self.killed.values()):
            return []
        return left

    def on_report(self, report: Report, stats: TrainingStats, topology: Topology, now: float) -> None:
        """A replaced worker's first frames: it serves again."""
        if not self.recovering or not isinstance(report, RolloutReport) or not report.frames:
            return
        entry = self.recovering.get(report.worker)
        if entry is None or topology.control is entry[2] and (entry[1] is None or report.incarnation < entry[1]):
            return
        fault = self.recovering.pop(report.worker)[0]
        stats.faults.recovered(fault, now, stats.frames)
        log.info("%s serves again, %.1fs after its fault was seen (the run counted %s frames meanwhile)",
                 fault.component, now - fault.at, f"{fault.frames_meanwhile:,}")


def _count_restart(stats: TrainingStats, why: str) -> str:
    stats.worker_restarts += 1
    log.warning("%s; --env_fault_policy=restart: restarting every component from a fresh checkpoint (restart %d of "
                "at most %d)", why, stats.worker_restarts, MAX_WORKER_RESTARTS)
    return why
