"""A rollout worker that runs the policy itself: --inference_in_rollout_workers.

By default a rollout worker asks an inference worker for each split's actions (policy_request) and steps the
split when they come back (advance): two messages and, on a machine with few cores, two process switches per
split step. For a small model the forward pass costs less than that round trip. With the flag each rollout
worker holds its own copy of the policy on the CPU (a `PolicyActor`, as an inference worker does) and acts for
its splits itself: a split's request is queued, the first one since the worker last acted posts act_locally to
the worker's own loop, and that slot acts for every queued split in one forward pass, then steps them (the
advance an inference worker would have sent). Weights come from the same shared memory, read whenever their
version moved, so --async_rl=False keeps a policy lag of 0. No inference worker process is started.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

from sf_core.algo.model import ModelSpec
from sf_core.contracts.buffers import SharedWeights
from sf_core.contracts.component import guarded
from sf_core.contracts.signals import ACT_LOCALLY
from sf_core.sampling.policy_actor import PolicyActor, Request

SEED_STRIDE = 7919  # each worker's action noise its own stream, as each inference worker's is


@dataclass(frozen=True)
class LocalPolicy:
    """What a rollout worker needs to act itself: the policy's shared weights, its model's spec and spaces."""

    weights: SharedWeights
    spec: ModelSpec
    spaces: tuple[gym.Space, gym.Space]


class LocalActing:
    """The rollout worker's side of --inference_in_rollout_workers (a mixin of RolloutWorker, whose attributes
    it reads: cfg, buffers, layout, seed, worker, clock, asked, stopping)."""

    local: LocalPolicy | None
    actor: PolicyActor | None = None
    act_seconds = 0.0  # since the last report

    def _start_local_acting(self: Any) -> None:
        """In the worker's process, before its envs are made."""
        if self.local is None:
            return
        torch.manual_seed(self.seed + SEED_STRIDE * (self.worker + 1))  # a replacement's seed differs already
        self.actor = PolicyActor(self.cfg, self.buffers, self.local.weights, self.layout, self.local.spaces,
                                 self.local.spec, "cpu", 0, self.clock)
        self.actor.build()
        self.ready: list[Request] = []
        self.act_seconds = 0.0

    def _ask_locally(self: Any, split: int, ticket: int) -> None:
        if not self.ready:
            ACT_LOCALLY.emit(self)
        self.ready.append((self.worker, ticket, *self.asked[split]))

    @guarded
    def act_locally(self: Any) -> None:
        requests, self.ready = self.ready, []
        if self.stopping or not requests:  # actions that would come after stop() closed the envs
            return
        started = time.perf_counter()
        self.beat("policy forward pass")
        self.actor.act(requests)
        self.act_seconds += time.perf_counter() - started
        self.advance(0, [ticket for _, ticket, *_ in requests])
