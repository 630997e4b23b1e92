"""Replacing a dead or hung rollout worker or inference worker alone (--env_fault_policy=restart; docs/faults.md).

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

An inference worker's process is replaced the same way (same routing, queue probes and caps), and besides:
- Its requests. Its incarnation goes up before it starts (ControlBlock.servers), and each request's ticket names the
  incarnation of the inference worker it was sent to. The new process loads the current weights, drops the requests
  sent to its predecessor, then tells the rollout workers it serves to send again those not answered yet
  (resend_requests): each is answered once, by it, and an answer the dead process gave meanwhile is not stepped.
- What it cannot survive, where every component is restored from the newest checkpoint instead (the runner's
  recovery, sf_core/run/recovery.py, as with --env_fault_policy=stop): a queue left locked; the shared weights' lock
  left taken (a semaphore, not robust either: the learner could no longer publish); a recurrent policy (the process
  may have moved an env's recurrent state on for a request it never answered, and the request sent again would act
  from that); more than --max_worker_replacements replacements within --worker_replacement_window.
"""

from __future__ import annotations

import logging
import os
import signal
from collections import deque
from dataclasses import dataclass

from sf_core.common.forking import frozen_heap
from sf_core.config import Config
from sf_core.contracts.component import Component, Routing
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.queue_lock import QueueLock
from sf_core.contracts.signals import InferenceReport, Report, RolloutReport
from sf_core.machine.wiring import Topology
from sf_core.run.fault_log import REPLACED, RESTARTED_ALL, STOPPED, Fault
from sf_core.run.recovery import Recovery
from sf_core.run.stats import TrainingStats
from sf_core.sampling.inference_worker import InferenceWorker
from sf_core.sampling.rollout_worker import RolloutWorker

log = logging.getLogger("sf_core")

QUEUE_PROBE_SEC = 1.0  # a queue a put cannot enter this long is held by a dead process
KILL_GRACE_SEC = 5.0  # after a hung worker is killed, other silent components are given this long to wake up
RESTART_ALL, STOP = "restart all", "stop"
MAX_WORKER_RESTARTS = 5  # full restarts of a run, when a worker cannot be replaced alone


@dataclass
class Verdict:
    # REPLACED; RESTART_ALL: every component restarts from a fresh checkpoint; STOP: the runner's recovery restores
    # every component from the newest checkpoint where it handles the death (sf_core/run/recovery.py), else the
    # run stops
    action: str
    message: str


def _give_back_the_runners_lock(worker: RolloutWorker) -> None:
    """A worker killed inside a put to the runner leaves the runner's queue locked. The loop watchdog gives that lock
    back once the loop stalls on it (sf_core/contracts/loop_watchdog.py), but a health check may meet the death
    first: given back here too, the worker is replaced alone either way, not with every other component."""
    queue = Routing.queue_to(worker, "runner")
    lock = QueueLock.of(queue) if queue is not None else None
    if lock is not None and (owner := lock.release_if_owner_died()):
        log.warning("a dead process (thread %d) left the runner's signal queue locked: given back", owner)


class WorkerReplacement:
    def __init__(self, enabled: bool, limit: int, window: float, heartbeat_timeout: float, restart_policy: bool):
        self.restart_policy = restart_policy  # --env_fault_policy=restart
        self.enabled, self.limit, self.window, self.heartbeat_timeout = enabled, limit, window, heartbeat_timeout
        self.replaced_at: dict[str, deque[float]] = {}  # worker -> when it was replaced, within the window
        self.killed: dict[int, tuple[str, float]] = {}  # pid of a hung worker killed -> (why, when)
        # ("rollout", worker) or ("inference", policy, index) -> its fault, and the incarnation of its new process in
        # the topology's control block then (None: every component restarts; any report from a later topology's is
        # its new process's)
        self.recovering: dict[tuple, tuple[Fault, int | None, ControlBlock | None]] = {}

    @classmethod
    def for_run(cls, cfg: Config, serial: bool) -> "WorkerReplacement":
        """Serial mode has no worker process to replace: a dead one is the whole run."""
        return cls(cfg.env_fault_policy == "restart" and not serial, cfg.max_worker_replacements,
                   cfg.worker_replacement_window, cfg.heartbeat_timeout, cfg.env_fault_policy == "restart")

    def on_death(self, proc, died: str, topology: Topology, stats: TrainingStats, now: float,
                 running: bool) -> Verdict:
        """What to do now that `proc` is dead (`died` says how): replace it alone, restart every component
        or stop the run (for an inference worker: hand it to the runner's recovery). `running`: no stop condition
        was met yet."""
        can_restart_all = running and self.may_restart_all(proc, topology, stats)
        worker = getattr(proc, "reporter", None)
        servers = _servers(proc, topology)
        if not self.enabled or not (isinstance(worker, RolloutWorker) or servers):
            return Verdict(RESTART_ALL, _count_restart(stats, died)) if can_restart_all else Verdict(STOP, died)
        cause = self.killed.pop(proc.pid, (died, now))[0]
        if servers:
            return self._replace_servers(proc, servers, cause, topology, stats, now)
        assert isinstance(worker, RolloutWorker)
        times = self._recent(worker.name, now)
        if len(times) >= self.limit:
            return self._not_alone(worker, topology, stats, now, STOP, f"{cause}; {self._spent(len(times))}")
        _give_back_the_runners_lock(worker)
        locked = Routing.locked_queues(worker, QUEUE_PROBE_SEC)
        if locked:
            return self._not_alone(worker, topology, stats, now, RESTART_ALL if can_restart_all else STOP, (
                f"{cause}; the signal queue of {', '.join(locked)} stays locked (the process died inside a put or "
                f"get): it cannot be replaced alone"))
        control = topology.control
        assert control is not None and control.heartbeats is not None, "async mode has a control block"
        incarnation = control.next_incarnation(worker.worker)  # before it can send a request
        self._start_again(proc, [worker], control)
        self._replaced(worker, _key(worker), incarnation, cause, times, stats, now, control)
        return Verdict(REPLACED, cause)

    def _replace_servers(self, proc, servers: list[InferenceWorker], cause: str, topology: Topology,
                         stats: TrainingStats, now: float) -> Verdict:
        """An inference worker's process (with several policies it may serve each of them): replaced alone where
        that is safe; else the verdict STOP hands it to the runner's recovery, which restores every component from
        the newest checkpoint (sf_core/run/recovery.py)."""
        reporter = servers[0]
        times = self._recent(reporter.name, now)
        unsafe = _unsafe(servers) if len(times) < self.limit else f"{self._spent(len(times))}, not alone again"
        if unsafe:
            return Verdict(STOP, f"{cause}; {unsafe}")
        control = topology.control
        assert control is not None and control.heartbeats is not None, "async mode has a control block"
        incarnations = [control.next_server_incarnation(server.server) for server in servers]  # before it serves
        self._start_again(proc, servers, control)
        self._replaced(reporter, _key(reporter), incarnations[0], cause, times, stats, now, control)
        return Verdict(REPLACED, cause)

    def _recent(self, name: str, now: float) -> deque[float]:
        """When `name` was replaced within the window."""
        times = self.replaced_at.setdefault(name, deque())
        while times and now - times[0] > self.window:
            times.popleft()
        return times

    def _spent(self, count: int) -> str:
        return (f"it was already replaced {count} times within {self.window:g}s "
                f"(--max_worker_replacements={self.limit}, --worker_replacement_window={self.window:g})")

    def _replaced(self, component: Component, key: tuple, incarnation: int, cause: str, times: deque[float],
                  stats: TrainingStats, now: float, control: ControlBlock) -> None:
        times.append(now)
        fault = stats.faults.record(component.name, cause, REPLACED, now, stats.frames)
        self.recovering[key] = (fault, incarnation, control)
        log.warning("%s: %s; --env_fault_policy=restart: replacing it alone (replacement %d of this worker within "
                    "%gs; at most %d: --max_worker_replacements)", component.name, cause, len(times), self.window,
                    self.limit)

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
            self.recovering[_key(worker)] = (fault, None, topology.control)
            _count_restart(stats, why)
        return Verdict(action, why)

    @staticmethod
    def _start_again(proc, components: list[Component], control: ControlBlock) -> None:
        """A new process for `components` (their incarnations raised already), with fresh heartbeats."""
        assert control.heartbeats is not None
        for component in components:
            control.heartbeats.restart(component.name)
        Routing.poll_only(proc.event_loop)  # the dead process may have been waiting on it (PollingQueue says why)
        proc.renew()
        with frozen_heap():
            proc.start()

    def kill_hung(self, topology: Topology, now: float, recovery: Recovery | None,
                  pid: int | None = None) -> tuple[str, str] | None:
        """Kill every hung rollout or inference worker (its death is then handled by `on_death`), and hand the other
        components silent for longer than --heartbeat_timeout (`Heartbeats.stalled`'s) to `recovery`, which kills
        those it will recover from. Returns the first that nothing follows (no `recovery`: all), with why; none while
        a worker killed moments ago is not replaced yet: a component blocked behind it may wake up. `pid`: only that
        process's, for the runner's loop watchdog (sf_core/contracts/loop_watchdog.py) while the loop is stuck
        behind it."""
        heartbeats = topology.control.heartbeats if topology.control is not None else None
        left: list[tuple[str, str]] = []
        for name, silent, activity in heartbeats.stalled(self.heartbeat_timeout, now) if heartbeats else ():
            proc = topology.host.get(name)
            if pid is not None and getattr(proc, "pid", None) != pid:
                continue
            silence = (f"no heartbeat for {silent:.0f}s (--heartbeat_timeout={self.heartbeat_timeout:g}); its last "
                       f"activity: {activity}")
            if not self.enabled or not (isinstance(getattr(proc, "reporter", None), RolloutWorker)
                                        or _servers(proc, topology)):
                left.append((name, silence))
                continue
            if proc is None or proc.pid is None or proc.pid in self.killed:
                continue
            why = f"process {proc.name} (pid {proc.pid}) hung: {silence}"
            log.warning("%s: %s; killing it", name, why)
            self.killed[proc.pid] = (why, now)
            try:
                os.kill(proc.pid, signal.SIGKILL)  # stops a stopped process too (SIGSTOP)
            except ProcessLookupError:
                pass  # died meanwhile
        if any(now - at < KILL_GRACE_SEC for _, at in self.killed.values()):
            return None
        for name, why in left:
            if recovery is None or not recovery.kill_hung(topology, name, why):
                return name, why
        return None

    def on_report(self, report: Report, stats: TrainingStats, topology: Topology, now: float) -> None:
        """A replaced worker's first frames, or a replaced inference worker's first requests served: it serves
        again."""
        if not self.recovering:
            return
        if isinstance(report, RolloutReport) and report.frames:
            key: tuple = ("rollout", report.worker)
        elif isinstance(report, InferenceReport) and report.requests:
            key = ("inference", report.policy, report.index)
        else:
            return
        entry = self.recovering.get(key)
        if entry is None or topology.control is entry[2] and (entry[1] is None or report.incarnation < entry[1]):
            return
        fault = self.recovering.pop(key)[0]
        stats.faults.recovered(fault, now, stats.frames)
        log.info("%s serves again, %.1fs after its fault was seen (the run counted %s frames meanwhile)",
                 fault.component, now - fault.at, f"{fault.frames_meanwhile:,}")


def _key(component: RolloutWorker | InferenceWorker) -> tuple:
    """What `recovering` knows a worker by (its reports name it so)."""
    if isinstance(component, RolloutWorker):
        return ("rollout", component.worker)
    return ("inference", component.policy_index, component.index)


def _servers(proc, topology: Topology) -> list[InferenceWorker]:
    """The inference workers `proc` hosts if it hosts nothing else (with several policies, one process may serve
    each of them: --policy_processes), the one whose name its death is reported under first; else none."""
    hosted = [c for c in topology.components if topology.host.get(c.name) is proc]
    if not hosted or not all(isinstance(c, InferenceWorker) for c in hosted) or getattr(proc, "threads", None):
        return []
    reporter = getattr(proc, "reporter", None)
    return sorted(hosted, key=lambda c: c is not reporter)


def _unsafe(servers: list[InferenceWorker]) -> str | None:
    """Why the process of these inference workers cannot be replaced alone, if it cannot."""
    if any(server.buffers.spaces.rnn_state_size for server in servers):
        return ("its policy is recurrent (it may have moved an env's recurrent state on for a request it never "
                "answered): it cannot be replaced alone")
    for server in servers:
        locked = Routing.locked_queues(server, QUEUE_PROBE_SEC)
        if locked:
            return (f"the signal queue of {', '.join(locked)} stays locked (the process died inside a put or get): "
                    f"it cannot be replaced alone")
        if not server.weights.lock.acquire(timeout=QUEUE_PROBE_SEC):
            return (f"the shared weights' lock of policy {server.policy_index} stays taken (it died copying new "
                    f"weights): it cannot be replaced alone")
        server.weights.lock.release()
    return None


def _count_restart(stats: TrainingStats, why: str) -> str:
    stats.worker_restarts += 1
    log.warning("%s; --env_fault_policy=restart: restarting every component from a fresh checkpoint (restart %d of "
                "at most %d)", why, stats.worker_restarts, MAX_WORKER_RESTARTS)
    return why
