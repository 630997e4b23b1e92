"""A policy's forward passes over rows of the trajectory buffers: what an inference worker does for the requests
it gathers, and what a rollout worker does itself under --inference_in_rollout_workers.

For the rows of a batch of requests it reads the observations from the trajectory buffers and writes actions,
log-probs, values and the policy version into the same rows; no values where the learner computes them
(`Config.values_at_learner`: it then runs the actor alone). For envs truncated on the previous step it also
writes the value of their final observation (`trunc_values`), which the learner bootstraps from. The weights are
read from `SharedWeights` whenever its version moved since the last forward pass.
"""

from __future__ import annotations

import math
import time

import gymnasium as gym
import numpy as np
import torch

from sf_core.algo.model import ActorCritic, ModelSpec, autocast, store_weights_in_bfloat16
from sf_core.config import Config
from sf_core.contracts.buffers import BufferLayout, SharedWeights, TrajectoryBuffers
from sf_core.contracts.sample import RowOrigin
from sf_core.contracts.timing import PhaseClock
from sf_core.sampling.device_io import DeviceIO
from sf_core.sampling.graphed_acting import GraphedActing

Request = tuple[int, int, int, int, int, bool]  # policy_request's payload (sf_core/contracts/signals.py)


class Rows:
    """The buffer rows one forward pass acts on, as numpy index tuples. One policy: every env row of each
    request (`lead` = [requests, rows per split]), indexed by (slot, row). Several: only the rows this policy
    acts for (`lead` = [rows]), each indexed by (slot, row, env row). What only a recurrent core needs is
    computed when asked (a feed-forward policy's flush pays for two index arrays)."""

    def __init__(self, requests: list[Request], layout: BufferLayout, policy_id: np.ndarray, policy: int,
                 num_policies: int):
        n = len(requests)
        self.requests, self.layout = requests, layout
        self.slots = np.fromiter((r[2] for r in requests), dtype=np.int64, count=n)
        self.rows = np.fromiter((r[3] for r in requests), dtype=np.int64, count=n)
        self.req: np.ndarray | None = None  # which request each selected row belongs to (several policies)
        self.env: np.ndarray | None = None
        if num_policies == 1:  # the fast path: whole splits
            self.lead: tuple[int, ...] = (n, layout.rows_per_split)
        else:
            self.req, self.env = np.nonzero(policy_id[self.slots, self.rows] == policy)
            self.lead = (len(self.req),)
        self.at = self.index(self.slots, self.rows)  # this row of each trajectory

    @property
    def count(self) -> int:
        return math.prod(self.lead)

    def index(self, slots: np.ndarray, rows: np.ndarray | int) -> tuple:
        """Index into a [slot, row, env row, ...] buffer for the selected rows."""
        if self.req is None:
            return slots, rows
        return slots[self.req], rows if isinstance(rows, int) else rows[self.req], self.env

    def per_request(self, values: np.ndarray) -> np.ndarray:
        """A value per request, broadcastable to `lead`."""
        return values[:, None] if self.req is None else values[self.req]

    def recurrent(self) -> tuple[tuple, tuple, tuple, np.ndarray, np.ndarray]:
        """(previous row, row 0 of the slot, the env row in per-split tensors, stepped, carried): a row after
        a step keeps its env's state unless an episode ended on the previous row (row -1 of a row 0 is masked
        by `stepped`); a carried row acts with its recorded state."""
        n = len(self.requests)
        origins = np.fromiter((r[4] for r in self.requests), dtype=np.int64, count=n)
        splits = np.fromiter((self.layout.split_index(r[0], self.layout.split_of(r[1])) for r in self.requests),
                             dtype=np.int64, count=n)
        at_split = (splits,) if self.req is None else (splits[self.req], self.env)
        return (self.index(self.slots, self.rows - 1), self.index(self.slots, 0), at_split,
                self.per_request(origins == RowOrigin.AFTER_STEP), self.per_request(origins == RowOrigin.CARRIED))


class PolicyActor:
    """One policy's model and the buffers' views it acts on; `build` in the process that acts."""

    def __init__(self, cfg: Config, buffers: TrajectoryBuffers, weights: SharedWeights, layout: BufferLayout,
                 spaces: tuple[gym.Space, gym.Space], spec: ModelSpec, device: str, policy: int, clock: PhaseClock):
        self.cfg, self.buffers, self.weights, self.layout = cfg, buffers, weights, layout
        self.spaces, self.spec, self.device, self.policy_index, self.clock = spaces, spec, device, policy, clock
        self.model: ActorCritic | None = None
        self.version = -1

    def build(self) -> None:
        """The model on the device with the current weights, and numpy views of the shared buffers (made in this
        process: one pickled to a spawned process would be a private copy)."""
        self.model = ActorCritic(*self.spaces, self.spec).to(self.device)
        self.clock.mark("model_on_device")  # on a GPU: CUDA's context made too
        self.model.eval()
        if self.cfg.mixed_precision:
            store_weights_in_bfloat16(self.model)  # load_into converts each new version once
        self.version = self.weights.load_into(self.model)
        self.views = {key: t.numpy() for key, t in self.buffers.fields.items()}
        self.views["rnn_latest"] = self.buffers.rnn_latest.numpy()
        self.actor_only = self.cfg.values_at_learner() and not self.policy.recurrent
        self.io = DeviceIO(self.device, yield_while_waiting=self.cfg.cuda_sync == "yield")
        self.graphs: GraphedActing | None = None
        if self.cfg.cuda_graphs and torch.device(self.device).type == "cuda" and not self.policy.recurrent:
            self.graphs = GraphedActing(lambda obs: self._sample(obs, graphed=True), self.policy, self.device,
                                        min_rows=self.layout.rows_per_split if self.cfg.num_policies == 1 else 8)
        self.obs_row_shape = self.views["obs"].shape[3:]  # past [slot, row, env row]: one observation

    def act(self, requests: list[Request]) -> None:
        """Act for the rows of `requests`, with the newest weights."""
        if self.weights.current_version() != self.version:
            started = time.perf_counter()
            self.version = self.weights.load_into(self.policy)
            self.clock.add("load_weights", time.perf_counter() - started)
        with torch.no_grad():
            # values of cut episodes first: with a recurrent core they need each env's state before this step
            self.truncation_values([r for r in requests if r[5]])
            rows = Rows(requests, self.layout, self.views["policy_id"], self.policy_index, self.cfg.num_policies)
            if rows.count:
                self.act_on(rows)

    def act_on(self, rows: Rows) -> None:
        """Sample actions for these rows and store them with their log-probs, values and the policy version."""
        views, clock, started = self.views, self.clock, time.perf_counter()
        obs = self.io.gather("obs", views["obs"], rows.at, self.obs_row_shape)
        gathered = time.perf_counter()
        if self.policy.recurrent:
            params, values, state, at_split = self._recurrent_step(obs, rows)
            outputs = {**self._sample_from(params, values), "rnn": state}
        else:
            outputs = self.graphs(obs) if self.graphs is not None else self._sample(obs)
        forwarded = time.perf_counter()
        # on a GPU the forward pass is queued, not run: its device time is the wait inside to_host
        out = self.io.to_host(outputs)
        returned = time.perf_counter()
        actions = outputs["actions"]
        if "rnn" in out:
            views["rnn_latest"][at_split] = out["rnn"].reshape(rows.lead + (-1,))
        views["actions"][rows.at] = out["actions"].reshape(rows.lead + tuple(actions.shape[1:]))
        views["log_prob"][rows.at] = out["log_prob"].reshape(rows.lead)
        if "values" in out:
            views["behaviour_values"][rows.at] = out["values"].reshape(rows.lead)
        views["policy_version"][rows.at] = self.version
        clock.add("gather_to_device", gathered - started)
        clock.add("forward", forwarded - gathered)
        clock.add("to_host", returned - forwarded)
        clock.add("scatter", time.perf_counter() - returned)
        clock.count("batches")
        clock.count("rows", rows.count)

    def _sample(self, obs: torch.Tensor, graphed: bool = False) -> dict[str, torch.Tensor]:
        with self.precision(cache=not graphed):
            if self.actor_only:  # the learner computes the values: the critic's body is not run here
                params, values = self.policy.action_params(obs), None
            else:
                params, values = self.policy(obs)
        return self._sample_from(params, values)

    def _sample_from(self, params: torch.Tensor, values: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Actions sampled from the policy's parameters, with their log-probs and the values in return units
        (none when the learner computes them)."""
        dist = self.policy.distribution(params.float())
        actions = dist.sample()
        out = {"actions": actions, "log_prob": dist.log_prob(actions)}
        if values is not None:
            out["values"] = self.policy.denormalize_value(values.float())
        return out

    @property
    def policy(self) -> ActorCritic:
        assert self.model is not None, "the model is built by build()"
        return self.model

    def precision(self, cache: bool = True):
        """The policy runs in bfloat16 under --mixed_precision, as the learner's forward pass does."""
        return autocast(self.device, self.cfg.mixed_precision, cache)

    def _recurrent_step(self, obs: torch.Tensor, rows: Rows):
        """Forward with each row's state: zero after a reset, the recorded one for a carried row, else
        the env's latest, zeroed where an episode ended on the previous row. Records the state used (the
        learner unrolls from it) and returns the new one, which `act_on` keeps as the env's latest, and where."""
        views = self.views
        at_previous, at_row0, at_split, stepped, carried = rows.recurrent()
        latest = views["rnn_latest"][at_split]  # after each env's previous observation
        ends = views["dones"][at_previous] | views["truncated"][at_previous]
        state_in = latest * (~ends & stepped)[..., None]
        if carried.any():
            state_in = np.where(carried[..., None], views["rnn_states"][at_row0], state_in)
        views["rnn_states"][rows.at] = state_in
        with self.precision():
            params, values, state_out = self.policy.step(obs, self.io.to_device(
                "rnn", state_in.reshape(-1, state_in.shape[-1])))
        return params, values, state_out.float(), at_split

    def truncation_values(self, requests: list[Request]) -> None:
        """V(final observation) for envs cut by a time limit on the previous row of these requests (only
        a step truncates, so that row is row - 1 of the same slot: the row-0 rule, sf_core/contracts/sample.py),
        by the policy that played the cut episode."""
        truncated, trunc_values = self.buffers["truncated"], self.buffers["trunc_values"]
        policy_id = self.buffers["policy_id"]
        for worker, split, slot, row, _, _ in requests:
            mask = truncated[slot, row - 1]
            if self.cfg.num_policies > 1:
                mask = mask & (policy_id[slot, row - 1] == self.policy_index)
                if not mask.any():
                    continue
            split_index = self.layout.split_index(worker, self.layout.split_of(split))
            final = self.buffers.final_obs[split_index][mask].to(self.device)
            with self.precision():
                if not self.policy.recurrent:
                    _, values = self.policy(final)
                else:  # the final observation would have been seen with the state the env had then
                    state = self.buffers.rnn_latest[split_index][mask].to(self.device)
                    _, values, _ = self.policy.step(final, state)
            trunc_values[slot, row - 1, mask] = self.policy.denormalize_value(values.float()).cpu()
