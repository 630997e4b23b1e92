"""Inference worker: batched policy forward passes for many envs at once.

Signals in: policy_request, flush_requests (to itself: one forward pass serves every request queued
before it), stop. Out: advance (to each rollout worker with a request served), report (sf_core/signals.py).

Reads observations from the trajectory buffers and writes actions, log-probs, values and the policy
version into the same rows. For envs truncated on the previous step it also writes the value of
their final observation (`trunc_values`), which the learner bootstraps from.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import torch

from algo.model import ActorCritic, ModelSpec, autocast, store_weights_in_bfloat16
from sf_core.buffers import BufferLayout, SharedWeights, TrajectoryBuffers
from sf_core.component import Component, guarded
from sf_core.config import Config
from sf_core.control import ControlBlock
from sf_core.sample import RowOrigin, check_request
from sf_core.signals import ADVANCE, FLUSH_REQUESTS, REPORT, InferenceReport
from signal_slot.signal_slot import EventLoop, Timer

Request = tuple[int, int, int, int, int, bool]  # policy_request's payload (sf_core/signals.py)

REPORT_INTERVAL_SEC = 1.0


class InferenceWorker(Component):
    def __init__(self, loop: EventLoop, index: int, cfg: Config, buffers: TrajectoryBuffers, weights: SharedWeights,
                 layout: BufferLayout, obs_space: gym.Space, action_space: gym.Space, spec: ModelSpec, device: str,
                 seed: int, control: ControlBlock | None = None):
        super().__init__(loop, f"inference_worker_{index}", control)
        self.index, self.cfg, self.buffers, self.weights, self.layout = index, cfg, buffers, weights, layout
        self.obs_space, self.action_space, self.device, self.seed = obs_space, action_space, device, seed
        self.spec = spec
        self.pending: list[Request] = []
        self.model: ActorCritic | None = None
        self.version = -1
        self.report = InferenceReport(index, 0, 0, 0.0)  # what happened since the last report
        loop.start.connect(self.on_start)

    @guarded
    def on_start(self) -> None:
        torch.manual_seed(self.seed + 7919 * (self.index + 1))
        self.model = ActorCritic(self.obs_space, self.action_space, self.spec).to(self.device)
        self.model.eval()
        if self.cfg.mixed_precision:
            store_weights_in_bfloat16(self.model)  # load_into converts each new version once
        self.version = self.weights.load_into(self.model)
        self.views = {key: t.numpy() for key, t in self.buffers.fields.items()}
        self.views["rnn_latest"] = self.buffers.rnn_latest.numpy()
        self.timer = Timer(self.event_loop, REPORT_INTERVAL_SEC, object_id=f"{self.name}_report_timer")
        self.timer.timeout.connect(self.send_report)

    @guarded
    def policy_request(self, worker: int, split: int, slot: int, row: int, origin: int, has_truncation: bool) -> None:
        check_request(row, origin, has_truncation)
        if not self.pending:
            FLUSH_REQUESTS.emit(self)
        self.pending.append((worker, split, slot, row, origin, has_truncation))

    @guarded
    def flush_requests(self) -> None:
        requests, self.pending = self.pending, []
        if not requests or self.model is None:
            return
        started = time.perf_counter()
        self.beat("policy forward pass")
        if self.weights.current_version() != self.version:
            self.version = self.weights.load_into(self.model)

        # numpy fancy indexing on the shared buffers: for a few dozen envs it is several times
        # cheaper than torch indexing (docs/performance.md)
        views, E = self.views, self.layout.rows_per_split
        slots = np.fromiter((r[2] for r in requests), dtype=np.int64, count=len(requests))
        rows = np.fromiter((r[3] for r in requests), dtype=np.int64, count=len(requests))
        shape = (len(requests), E)
        with torch.no_grad():
            obs = torch.from_numpy(views["obs"][slots, rows]).flatten(0, 1).to(self.device)
            if self.model.recurrent:
                splits = np.fromiter((self.layout.split_index(r[0], r[1]) for r in requests), dtype=np.int64,
                                     count=len(requests))
                origins = np.fromiter((r[4] for r in requests), dtype=np.int64, count=len(requests))
                params, values, latest = self._recurrent_step(obs, splits, slots, rows, origins)
            else:
                with self.precision():
                    params, values = self.model(obs)
            params, values = params.float(), values.float()
            dist = self.model.distribution(params)
            actions = dist.sample()
            views["actions"][slots, rows] = actions.cpu().numpy().reshape(shape + tuple(actions.shape[1:]))
            views["log_prob"][slots, rows] = dist.log_prob(actions).cpu().numpy().reshape(shape)
            views["behaviour_values"][slots, rows] = self.model.denormalize_value(values).cpu().numpy().reshape(shape)
            views["policy_version"][slots, rows] = self.version
            self._truncation_values([r for r in requests if r[5]], latest if self.model.recurrent else None)

        splits_by_worker: dict[int, list[int]] = {}
        for worker, split, *_ in requests:
            splits_by_worker.setdefault(worker, []).append(split)
        for worker, splits in splits_by_worker.items():  # one signal per worker, not per split
            ADVANCE.emit_to(self, worker, splits)
        self.report.requests += len(requests)
        self.report.batches += 1
        self.report.seconds += time.perf_counter() - started

    @property
    def policy(self) -> ActorCritic:
        assert self.model is not None, "the model is built in on_start"
        return self.model

    def precision(self):
        """The policy runs in bfloat16 under --mixed_precision, as the learner's forward pass does."""
        return autocast(self.device, self.cfg.mixed_precision)

    def _recurrent_step(self, obs: torch.Tensor, splits: np.ndarray, slots: np.ndarray, rows: np.ndarray,
                        origins: np.ndarray):
        """Forward with each row's state: zero after a reset, the recorded one for a carried row, else
        the env's latest, zeroed where an episode ended on the previous row. Records the state used (the
        learner unrolls from it) and keeps the new one. Returns (params, values, the states before this
        step, for truncation values)."""
        views = self.views
        latest = views["rnn_latest"][splits]  # [n, E, S]: after each env's previous observation
        stepped = origins == RowOrigin.AFTER_STEP
        ends = views["dones"][slots, rows - 1] | views["truncated"][slots, rows - 1]  # row -1: masked below
        keep = ~ends & stepped[:, None]
        state_in = latest * keep[..., None]
        carried = origins == RowOrigin.CARRIED
        if carried.any():
            state_in[carried] = views["rnn_states"][slots[carried], 0]
        views["rnn_states"][slots, rows] = state_in
        with self.precision():
            params, values, state_out = self.policy.step(obs, torch.from_numpy(state_in).flatten(0, 1).to(self.device))
        views["rnn_latest"][splits] = state_out.float().cpu().numpy().reshape(latest.shape)
        return params, values, {split: latest[i] for i, split in enumerate(splits)}

    def _truncation_values(self, requests: list[Request], latest: dict[int, np.ndarray] | None) -> None:
        """V(final observation) for envs cut by a time limit on the previous row of these requests (only
        a step truncates, so that row is row - 1 of the same slot: the row-0 rule, sf_core/sample.py)."""
        truncated, trunc_values = self.buffers["truncated"], self.buffers["trunc_values"]
        for worker, split, slot, row, _, _ in requests:
            mask = truncated[slot, row - 1]
            split_index = self.layout.split_index(worker, split)
            final = self.buffers.final_obs[split_index][mask].to(self.device)
            with self.precision():
                if latest is None:
                    _, values = self.policy(final)
                else:  # the final observation would have been seen with the state the env had then
                    state = torch.from_numpy(latest[split_index][mask.numpy()]).to(self.device)
                    _, values, _ = self.policy.step(final, state)
            trunc_values[slot, row - 1, mask] = self.policy.denormalize_value(values.float()).cpu()

    @guarded
    def send_report(self) -> None:
        REPORT.emit(self, self.report)
        self.report = InferenceReport(self.index, 0, 0, 0.0)

    @guarded
    def stop(self) -> None:
        self.stop_loop()
