"""Inference worker: batched policy forward passes for many envs at once.

Signals in: policy_request, flush_requests (to itself: one forward pass serves every request queued
before it), stop. Out: advance (to each rollout worker with a request served), report, and in a process that
replaced a dead one, resend_requests once it serves (sf_core/contracts/signals.py).

Each serves one policy. With several policies it acts only on the rows its policy controls (the
`policy_id` field) and values the cut episodes that policy played.

Its forward passes are a `PolicyActor`'s (sf_core/sampling/policy_actor.py): actions, log-probs, values and the
policy version written into the requests' rows of the trajectory buffers.

A worker may be a replacement for a process that died (sf_core/run/worker_replacement.py): it loads the current
weights, drops the requests sent to its predecessor (their tickets carry the predecessor's incarnation), and then
asks the rollout workers it serves to send again those their predecessor never answered.
"""

from __future__ import annotations

import time

import gymnasium as gym
import torch

from sf_core.algo.model import ModelSpec
from sf_core.config import Config
from sf_core.contracts.buffers import BufferLayout, SharedWeights, TrajectoryBuffers
from sf_core.contracts.component import Component, guarded
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.sample import check_request
from sf_core.contracts.signals import (ADVANCE, FLUSH_REQUESTS, REPORT, RESEND_REQUESTS, InferenceReport,
                                       inference_worker_name)
from sf_core.sampling.policy_actor import PolicyActor, Request
from signal_slot.signal_slot import EventLoop, Timer


REPORT_INTERVAL_SEC = 1.0


class InferenceWorker(Component):
    def __init__(self, loop: EventLoop, index: int, cfg: Config, buffers: TrajectoryBuffers, weights: SharedWeights,
                 layout: BufferLayout, obs_space: gym.Space, action_space: gym.Space, spec: ModelSpec, device: str,
                 seed: int, control: ControlBlock | None = None, policy: int = 0):
        super().__init__(loop, inference_worker_name(policy, index, cfg.num_policies), control)
        self.policy_index, self.index, self.cfg, self.layout, self.seed = policy, index, cfg, layout, seed
        self.buffers, self.weights = buffers, weights  # what a replacement checks first (run/worker_replacement.py)
        self.actor = PolicyActor(cfg, buffers, weights, layout, (obs_space, action_space), spec, device, policy,
                                 self.clock)
        self.pending: list[Request] = []
        self.control = control
        self.server = ControlBlock.server_index(policy, index, cfg.policy_workers_per_policy)
        self.incarnation = 0  # read at start: 1 and up in a process that replaced a dead one
        self.report = InferenceReport(index, policy, 0, 0, 0.0)  # what happened since the last report
        self.report_timing()  # and its on_start, from the loop's start

    @guarded
    def on_start(self) -> None:
        torch.manual_seed(self.seed + 7919 * (self.index + 1) + 104729 * self.policy_index)
        self.actor.build()  # a replacement's too: the current weights, before it serves
        self.incarnations = self.control.incarnations.numpy() if self.control is not None else None
        self.timer = Timer(self.event_loop, REPORT_INTERVAL_SEC, object_id=f"{self.name}_report_timer")
        self.timer.timeout.connect(self.send_report)
        if self.control is not None:
            self.incarnation = self.control.server_incarnation(self.server)
            self.report.incarnation = self.incarnation
        if self.incarnation:
            self._ask_to_resend()

    def _ask_to_resend(self) -> None:
        """A replacement serves now: each rollout worker it serves sends again what its predecessor did not answer
        (taken from the queue and lost with the process, or still queued: dropped here, a ticket of the old one)."""
        per_policy = self.cfg.policy_workers_per_policy
        for worker in range(self.layout.num_workers):
            if worker % per_policy == self.index:  # the wiring's: rollout worker w asks inference worker w % n
                RESEND_REQUESTS.emit_to(self, worker, self.policy_index)

    @guarded
    def policy_request(self, worker: int, split: int, slot: int, row: int, origin: int, has_truncation: bool) -> None:
        check_request(row, origin, has_truncation)
        if not self.pending:
            FLUSH_REQUESTS.emit(self)
        self.pending.append((worker, split, slot, row, origin, has_truncation))

    @guarded
    def flush_requests(self) -> None:
        requests, self.pending = self._current(self.pending), []
        if not requests or self.actor.model is None:
            return
        started = time.perf_counter()
        self.beat("policy forward pass")
        self.actor.act(requests)

        splits_by_worker: dict[int, list[int]] = {}
        for worker, split, *_ in requests:
            splits_by_worker.setdefault(worker, []).append(split)
        for worker, splits in splits_by_worker.items():  # one signal per worker, not per split
            ADVANCE.emit_to(self, worker, self.policy_index, splits)
        self.report.requests += len(requests)
        self.report.batches += 1
        self.report.seconds += time.perf_counter() - started
        if "first_forward" not in self.clock.reached:
            self.clock.mark("first_forward")
            if self.incarnation:  # the runner hears now that a replacement serves, not a report later
                self.send_report()

    def _current(self, requests: list[Request]) -> list[Request]:
        """The requests of each rollout worker's current process, sent to this process: one that replaced a dead
        worker (sf_core/run/worker_replacement.py) is filling the slots its predecessor's requests name, and a request
        sent to this worker's predecessor is sent again (resend_requests)."""
        incarnations, own = self.incarnations, self.incarnation
        if incarnations is None or not own and not incarnations.any():
            return requests
        layout = self.layout
        return [r for r in requests
                if layout.incarnation_of(r[1]) == incarnations[r[0]] and layout.server_of(r[1]) == own]

    @guarded
    def send_report(self) -> None:
        self.report.version = self.actor.version
        REPORT.emit(self, self.report)
        self.report = InferenceReport(self.index, self.policy_index, 0, 0, 0.0, incarnation=self.incarnation)

    @guarded
    def stop(self) -> None:
        self.stop_loop()
