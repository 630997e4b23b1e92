"""Rollout worker: owns envs (in `worker_num_splits` split runners) and steps them on request.

Signals in: advance, resend_requests, slots_freed, stop. Out: policy_request, new_trajectories, report
(sf_core/contracts/signals.py). With --env_service, also envs_stepped, from its own split stepper threads
(sf_core/sampling/split_stepper.py); with --inference_in_rollout_workers, act_locally, to itself instead of
policy_request and advance (sf_core/sampling/local_acting.py).

Double buffering: while one split waits for actions, the worker steps another one. A split runner is
a VectorEnvRunner (--batched_sampling=True), a NonBatchedEnvRunner (False, any multi-agent env), or a
NativeVectorRunner (one natively vectorized env per split, --env_vectorization).

A worker may be a replacement for a process that died (sf_core/run/worker_replacement.py): it starts with the
slots the batchers still hold held (sf_core/contracts/slot_holds.py), and names each split in its requests by a
ticket of its own incarnation, so the answers to its predecessor's requests are told apart and ignored. An
inference worker may be one too: each request's ticket also carries the incarnation of the inference worker asked,
and when a replacement serves (resend_requests) the requests sent to its predecessor and not answered yet are sent
again, to it; an answer the dead process gave meanwhile is ignored.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np

from sf_core.envs.registry import EnvRegistry
from sf_core.envs.vector_backends import vector_backend
from sf_core.config import Config
from sf_core.contracts.buffers import BufferLayout, TrajectoryBuffers
from sf_core.contracts.component import Component, guarded
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.sample import RowOrigin
from sf_core.contracts.signals import NEW_TRAJECTORIES, POLICY_REQUEST, REPORT, RolloutReport
from sf_core.sampling.local_acting import LocalActing, LocalPolicy
from sf_core.sampling.native_vector_runner import NativeVectorRunner
from sf_core.sampling.nonbatched_env_runner import NonBatchedEnvRunner
from sf_core.sampling.policy_mapping import PolicyMapping
from sf_core.sampling.slot_recovery import SlotRecovery
from sf_core.sampling.slot_waits import SlotWaits
from sf_core.sampling.split_runner import EnvStepError, SplitRunner
from sf_core.sampling.split_stepper import SplitSteppers
from sf_core.sampling.vector_env_runner import VectorEnvRunner
from sf_core.service import training as services
from sf_core.service.env_pool import EnvPool
from sf_core.service.remote_env import ServiceError
from sf_core.service.service_set import PoolGroup
from signal_slot.signal_slot import EventLoop, Timer

log = logging.getLogger("sf_core")

MAX_FAULTS_IN_A_ROW = 10  # restarts of one split without a finished trajectory before giving up
REPLACEMENT_SEED_STRIDE = 10_000_019  # a replacement's envs never replay the seeds of its predecessor's
REPORT_INTERVAL_SEC = 0.25  # frames counted this often: bounds overshoot of --train_for_env_steps


def runner_kind(cfg: Config, registry: EnvRegistry, served: bool) -> type[SplitRunner]:
    """The split runner for these flags; `served`: the envs are on env servers' slots (--env_service)."""
    if not cfg.batched_sampling:
        return NonBatchedEnvRunner
    native = not served and vector_backend(cfg, registry) is not None
    return NativeVectorRunner if native else VectorEnvRunner


class RolloutWorker(SlotRecovery, LocalActing, Component):
    def __init__(self, loop: EventLoop, worker: int, cfg: Config, registry: EnvRegistry, buffers: TrajectoryBuffers,
                 layout: BufferLayout, seed: int, control: ControlBlock | None = None,
                 mapping: PolicyMapping | str = "auto", sampler: tuple[int, int] = (0, 1),
                 local: LocalPolicy | None = None):
        super().__init__(loop, f"rollout_worker_{worker}", control)
        self.worker, self.cfg, self.registry, self.sampler, self.local = worker, cfg, registry, sampler, local
        self.buffers, self.layout, self.seed, self.mapping = buffers, layout, seed, mapping
        self.control = control
        self.incarnation = 0  # read at start: 1 and up in a process that replaced a dead one
        self.runners: list[SplitRunner] = []
        self.waiting_for_slot: set[int] = set()
        self.unstarted: set[int] = set()  # splits made while every slot of theirs was still with a batcher
        # per split: the policies whose answers it still waits for -> the incarnation of the inference worker asked
        self.awaiting: list[dict[int, int]] = [{} for _ in range(layout.num_splits)]
        self.asked: list[tuple[int, int, int, bool]] = [(0, 0, 0, False)] * layout.num_splits  # its last request
        per_policy = cfg.policy_workers_per_policy  # the wiring's: this worker asks inference worker w % n of each
        self.servers = [ControlBlock.server_index(p, worker % per_policy, per_policy) for p in range(cfg.num_policies)]
        self.held: set[int] = set()  # slots sent to a batcher and not yet freed (sf_core/contracts/slot_holds.py)
        self.frames, self.env_seconds, self.env_faults = 0, 0.0, 0  # since the last report
        self.timer: Timer | None = None
        # --env_service: this worker's slots, and its splits waiting for slots (sf_core/sampling/slot_waits.py)
        self.pool: EnvPool | PoolGroup | None = None
        self.steppers: SplitSteppers | None = None  # remote splits step on threads, all at once
        self.waits = SlotWaits(layout.envs_per_split, cfg.env_service_down_timeout)
        self.parked = self.waits.parked  # split -> since when
        self.skips_reported: set[str] = set()  # episode metrics whose skipped values the runner heard of
        self.stopping = False
        self.report_timing()  # and its on_start, from the loop's start

    @guarded
    def on_start(self) -> None:
        # numpy views of shared memory, made in this process: one pickled to a spawned process is a private copy
        self.policy_id = self.buffers["policy_id"].numpy()
        self.truncated = self.buffers["truncated"].numpy()
        self.server_incarnations = self.control.servers.numpy() if self.control is not None else None
        if self.control is not None:
            self.incarnation = self.control.incarnation(self.worker)
            self.seed += REPLACEMENT_SEED_STRIDE * self.incarnation
        self._open_pool()
        self.runners = []
        if self.pool is not None:
            self.steppers = SplitSteppers(self, lambda split: self.runners[split], self.layout.num_splits)
        self.timer = Timer(self.event_loop, REPORT_INTERVAL_SEC, object_id=f"{self.name}_report_timer")
        self.timer.timeout.connect(self.send_report)
        self._start_local_acting()
        self._make_splits()

    def _make_splits(self) -> None:
        """Make the next split's envs, reset them and ask for their actions; the split after it is made once this
        worker has heard back (advance), so the first frames are stepped while later splits are made (an Atari
        env takes 0.2 s to make). With --env_service all are made at once, and a split parked on a failed env slot
        is passed over."""
        kind = runner_kind(self.cfg, self.registry, self.pool is not None)
        while len(self.runners) < self.layout.num_splits:
            s = len(self.runners)
            self.beat("resetting envs")
            self.runners.append(kind(self.cfg, self.worker, s, self.registry, self.buffers, self.layout, self.seed,
                                     self.pool, self.mapping))
            self._claim_slots(s)
            if self._begin(s) and self.pool is None:  # served splits step on threads: all are made up front
                break
        if len(self.runners) == self.layout.num_splits:
            self.clock.mark("envs_made")

    def _claim_slots(self, split: int) -> None:
        """The split's free slots: all of them, except in a replacement those its predecessor left with a batcher."""
        free = []
        for k in range(self.layout.sets_per_split):
            slot = self.layout.slot_index(self.worker, split, k)
            if self.buffers.holds.is_free(slot):
                free.append(k)
            else:
                self.held.add(slot)
        self.runners[split].free_sets = deque(free)

    def _begin(self, split: int) -> bool:
        """Reset a new split's envs into a free slot and ask for their actions; False if it must wait (for a
        slot a batcher still holds, or parked on a failed env slot)."""
        runner = self.runners[split]
        if not runner.free_sets:  # starts once slots_freed frees one
            self.unstarted.add(split)
            return False
        try:
            runner.reset(runner.take_free_slot())
        except EnvStepError as exc:
            if not self._is_slot_failure(exc):
                raise
            self._park(split, exc)
            return False
        self._request(split, RowOrigin.AFTER_RESET)
        return True

    def _open_pool(self) -> None:
        """--env_service: this worker's slots, and a timer that retries the splits parked on a failed one."""
        self.pool = services.open_worker_pool(self.cfg, self.registry, self.worker, self.seed, self.name, self.sampler)
        if self.pool is None:
            return
        self.retry_timer = Timer(self.event_loop, self.cfg.env_service_recheck_interval,
                                 object_id=f"{self.name}_slot_retry_timer")
        self.retry_timer.timeout.connect(self.retry_parked)

    def _is_slot_failure(self, exc: BaseException) -> bool:
        return self.pool is not None and isinstance(exc.__cause__, ServiceError)

    def _request(self, split: int, origin: RowOrigin, has_truncation: bool = False) -> None:
        runner = self.runners[split]
        slot, row = runner.slot, runner.t
        policies = [0] if self.cfg.num_policies == 1 else self._policies_asked(slot, row, has_truncation)
        self.asked[split] = (slot, row, int(origin), has_truncation)
        # every answer awaited is known before the first request leaves (an answer may come back within an emit)
        self.awaiting[split] = {policy: self._server(policy) for policy in policies}
        for policy in policies:
            self._ask(split, policy)

    def _server(self, policy: int) -> int:
        """The incarnation of the process of `policy`'s inference worker that serves this worker now."""
        incarnations = self.server_incarnations if self.local is None else None  # local: no inference worker
        return int(incarnations[self.servers[policy]]) if incarnations is not None else 0

    def _ask(self, split: int, policy: int) -> None:
        """Send the split's request to `policy`'s inference worker, the process named in the ticket."""
        ticket = self.layout.ticket(split, self.incarnation, self.awaiting[split][policy])
        if self.local is not None:
            self._ask_locally(split, ticket)
            return
        POLICY_REQUEST.emit_to(self, policy, self.worker, ticket, *self.asked[split])

    @guarded
    def resend_requests(self, policy: int) -> None:
        """A new process serves for `policy`'s inference worker: the requests sent to an earlier one and not
        answered are sent again (it drops any still queued, so each is answered once)."""
        if self.stopping or self.server_incarnations is None:
            return
        current = self._server(policy)
        for split, awaited in enumerate(self.awaiting):
            if awaited.get(policy, current) < current:
                awaited[policy] = current
                self._ask(split, policy)

    def _policies_asked(self, slot: int, row: int, has_truncation: bool) -> list[int]:
        """The policies acting on the row, and those whose episodes a time limit cut on the row before:
        the final observation of a cut episode is valued by the policy that played it."""
        ids = set(np.unique(self.policy_id[slot, row]).tolist())
        if has_truncation:
            cut = self.truncated[slot, row - 1]
            ids.update(np.unique(self.policy_id[slot, row - 1][cut]).tolist())
        return sorted(ids)

    def _send_trajectories(self, slot: int) -> None:
        """Each policy with samples in the slot copies its rows; every hold is marked before any is sent."""
        self.held.add(slot)
        if self.cfg.num_policies == 1:
            self.buffers.holds.hold(0, slot)
            NEW_TRAJECTORIES.emit_to(self, 0, slot)
            return
        policies = np.unique(self.policy_id[slot, :self.layout.rollout]).tolist()  # row T is the next slot's
        for policy in policies:
            self.buffers.holds.hold(policy, slot)
        for policy in policies:
            NEW_TRAJECTORIES.emit_to(self, policy, slot)

    @guarded
    def advance(self, policy: int, splits: list[int]) -> None:
        if self.stopping:  # actions that arrive after stop() closed the envs are not stepped
            return
        for ticket in splits:
            if self.layout.incarnation_of(ticket) != self.incarnation:  # asked by the process this one replaced
                continue
            split = self.layout.split_of(ticket)
            awaited = self.awaiting[split]
            # an inference worker's dead process answered before this worker sent the request again: not stepped
            if awaited.get(policy) != self.layout.server_of(ticket):
                continue
            del awaited[policy]
            if awaited:  # another policy has yet to act on this row
                continue
            runner = self.runners[split]
            if not runner.trajectory_complete():
                self._step(split)
                continue
            runner.faults_in_a_row = 0
            self._send_trajectories(runner.slot)
            self._leave_draining_slots(split)
            if runner.next_slot():
                self._continue(split)
            else:
                self.waiting_for_slot.add(split)
        if len(self.runners) < self.layout.num_splits:
            self._make_splits()

    def _continue(self, split: int) -> None:
        """The split's next trajectory starts in the slot it just moved to: where the last one stopped, or with
        new episodes after it let go of a drained env slot."""
        if split in self.waits.restarting:
            self.waits.restarting.discard(split)
            failure = self._restart_episodes(split)
            if failure is not None:
                self._park(split, failure)
            else:
                self._request(split, RowOrigin.AFTER_RESET)
        elif self.cfg.datasets_ahead() is None:
            self._step(split)
        else:  # slots held until trained on: row 0's carried action predates the weights trained meanwhile
            self._request(split, RowOrigin.CARRIED)

    def _leave_draining_slots(self, split: int) -> None:
        """Elastic pools: the split's trajectory is complete and sent, so an env slot being drained is given
        back now (it leaves the pool and is closed on its server). The split's episodes in progress end
        there: its next trajectory starts new ones, on other slots where needed (or waits for them)."""
        runner = self.runners[split]
        if self.pool is None or not runner.let_go_draining():
            return
        self.waits.drained(split)
        log.info("%s: split %d gave back a drained env slot after its rollout; its %d env(s) start new episodes",
                 self.name, split, self.layout.envs_per_split)

    def _step(self, split: int) -> None:
        self.beat("stepping envs")
        if self.steppers is not None:  # on the split's own thread; envs_stepped comes back
            self.steppers.submit(split)
            return
        started = time.perf_counter()
        try:
            has_truncation = self.runners[split].step()
        except EnvStepError as exc:
            self._step_failed(split, exc)
            return
        self._stepped(split, has_truncation, time.perf_counter() - started)

    @guarded
    def envs_stepped(self, split: int) -> None:
        assert self.steppers is not None  # emitted only by them
        outcome = self.steppers.take(split)
        if self.stopping:
            return
        if outcome.error is None:
            self._stepped(split, outcome.has_truncation, outcome.seconds)
        elif isinstance(outcome.error, EnvStepError):
            self._step_failed(split, outcome.error)
        else:
            raise outcome.error

    def _stepped(self, split: int, has_truncation: bool, seconds: float) -> None:
        self.env_seconds += seconds
        if self.steppers is None:  # remote splits step on threads, outside the loop's slot time
            self.clock.add("env_step", seconds)
        # one frame per agent step (a row): the unit the learner trains on, for multi-agent envs too
        self.frames += self.layout.rows_per_split * self.cfg.env_frameskip
        if "first_step" not in self.clock.reached:  # the runner hears of the first frame now, not a report later
            self.clock.mark("first_step")
            self.send_report()
        self._request(split, RowOrigin.AFTER_STEP, has_truncation)

    def _step_failed(self, split: int, exc: EnvStepError) -> None:
        if self._is_slot_failure(exc):
            self._recover_split(split, exc)
            return
        if self.cfg.env_fault_policy != "restart":
            raise exc
        self._restart_split(split, exc)

    def _restart_split(self, split: int, error: Exception) -> None:
        """--env_fault_policy=restart: new envs, and the half-finished trajectory is written over.
        Building or resetting the new envs may fail too: that counts as one more fault in a row."""
        runner = self.runners[split]
        while True:
            self.env_faults += 1
            runner.faults_in_a_row += 1
            if runner.faults_in_a_row > MAX_FAULTS_IN_A_ROW:
                raise EnvStepError(f"{error} — and {MAX_FAULTS_IN_A_ROW} restarts in a row did not help") from error
            log.warning("%s: %s; restarting split %d's envs (fault %d on this worker)", self.name, error, split,
                        self.env_faults)
            self.beat("resetting envs")
            runner.close()
            try:
                fresh = runner.recreated()
                fresh.reset(runner.slot)
            except Exception as exc:  # noqa: BLE001 - the env's own failure, retried up to the limit
                error = exc
                continue
            self.runners[split] = fresh
            self._request(split, RowOrigin.AFTER_RESET)
            return

    @guarded
    def slots_freed(self, slots: list[int]) -> None:
        S, K = self.layout.num_splits, self.layout.sets_per_split
        for slot in slots:
            # another policy's batcher may still hold it; or the message was meant for the process this one
            # replaced (a slot of a split not made yet, or one sent again since): the holds tell
            if slot not in self.held or not self.buffers.holds.is_free(slot):
                continue
            self.held.discard(slot)
            split, k = (slot // K) % S, slot % K
            self.runners[split].release(k)
            if split in self.unstarted:
                self.unstarted.discard(split)
                self._begin(split)
            elif split in self.waiting_for_slot and self.runners[split].next_slot():
                self.waiting_for_slot.discard(split)
                self._continue(split)

    @guarded
    def send_report(self) -> None:
        episodes, matches, objectives, metrics = [], [], [], []
        skipped: dict[str, str] = {}
        in_flight = self.steppers.in_flight if self.steppers is not None else ()
        for split, runner in enumerate(self.runners):
            if split in in_flight:  # its thread may be adding to these lists: next report
                continue
            episodes += runner.finished_episodes
            matches += runner.finished_matches
            objectives += runner.finished_objectives
            metrics += runner.finished_metrics
            skipped.update((k, why) for k, why in runner.skipped_metrics.items() if k not in self.skips_reported)
            runner.finished_episodes, runner.finished_matches, runner.finished_objectives = [], [], []
            runner.finished_metrics, runner.skipped_metrics = [], {}
        self.skips_reported.update(skipped)
        service = self.waits.report(self.pool) if self.pool is not None else None
        REPORT.emit(self, RolloutReport(self.worker, self.frames, episodes, self.env_seconds, self.env_faults,
                                        service, matches, objectives, metrics=metrics, skipped_metrics=skipped,
                                        incarnation=self.incarnation, act_seconds=self.act_seconds))
        self.frames, self.env_seconds, self.env_faults, self.act_seconds = 0, 0.0, 0, 0.0

    @guarded
    def stop(self) -> None:
        self.stopping = True
        if self.steppers is not None:  # before the pool closes under a step in flight
            self.steppers.close(self.cfg.env_service_timeout + 1.0)
        if self.pool is not None:  # stopping: no need to restore instances on the way out
            self.pool.close()
        for runner in self.runners:
            runner.close()
        self.stop_loop()
