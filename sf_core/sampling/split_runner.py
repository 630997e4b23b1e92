"""What every split runner shares: its envs' trajectory slots, the carry-over between them, and
how a step's rewards and flags are stored.

A split runner owns the envs of one split of a rollout worker and the rows they fill in the split's
current slot. Three kinds step the envs (chosen by --batched_sampling and --env_vectorization):
- `VectorEnvRunner` (sf_core/sampling/vector_env_runner.py): single-agent envs, one row each, stepped as one batch;
- `NonBatchedEnvRunner` (sf_core/sampling/nonbatched_env_runner.py): each env on its own, one row per agent;
- `NativeVectorRunner` (sf_core/sampling/native_vector_runner.py): one natively vectorized env (a gymnasium
  VectorEnv) of the split's envs, one row per sub-env, stepped with one call.
Neither waits for anything itself: the RolloutWorker decides when a split may step.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from sf_core.algo.observations import ObsWriter
from sf_core.envs.env_check import GYMNASIUM_API, EnvContractError
from sf_core.envs.registry import EnvContext, EnvRegistry
from sf_core.config import Config
from sf_core.contracts.buffers import BufferLayout, TrajectoryBuffers
from sf_core.contracts.sample import CARRIED
from sf_core.contracts.signals import Episode, Match, Metric
from sf_core.sampling.episode_metrics import episode_metrics
from sf_core.sampling.policy_mapping import AgentPolicies, PolicyMapping
from sf_core.service.env_pool import EnvPool
from sf_core.service.pooled_env import PooledEnv
from sf_core.service.service_set import PoolGroup, ServiceSet, ServiceSetEnv

BUILT_IN_OBJECTIVES = ("episode_return", "win_rate")


class EnvStepError(RuntimeError):
    pass


# what a write of an env's values into the buffers (or a test of its flags) raises when they break the contract
STORE_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError)


def env_action_converter(space: gym.Space, num_envs: int | None = None) -> Callable[[np.ndarray], Any]:
    """Policy outputs (as stored in buffers) to what env.step expects; with `num_envs`, a batch of them to what
    a VectorEnv's step expects (a fresh array: the env never holds a view of the shared buffer)."""
    if isinstance(space, gym.spaces.Discrete):
        start = int(space.start)
        return (lambda a: int(a) + start) if num_envs is None else (lambda a: a + start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = np.asarray(space.start).ravel()
        shape = space.nvec.shape if num_envs is None else (num_envs, *space.nvec.shape)
        return lambda a: (a.astype(np.int64) + start).reshape(shape)
    if isinstance(space, gym.spaces.Box):
        low, high = space.low, space.high
        return lambda a: np.clip(a, low, high).astype(space.dtype)
    raise ValueError(f"unsupported action space {space}")


def episode_outcome(info: dict, running_return: float, running_length: int) -> tuple[float, int] | None:
    """An ended episode's return and length: the env's own statistics where its last info has them (Atari: whole
    games; None while the game goes on, after a lost life), else the running totals."""
    if "episode_return" not in info:
        return running_return, running_length
    if info["episode_return"] is None:
        return None
    return float(info["episode_return"]), int(info["episode_length"])


class SplitRunner:
    def __init__(self, cfg: Config, worker: int, split: int, registry: EnvRegistry, buffers: TrajectoryBuffers,
                 layout: BufferLayout, seed: int, pool: EnvPool | PoolGroup | None = None,
                 mapping: PolicyMapping | str = "auto"):
        self._args = (cfg, worker, split, registry, buffers, layout, seed, pool, mapping)
        self.pool = pool
        self.cfg, self.worker, self.split = cfg, worker, split
        self.layout = layout
        self.split_index = layout.split_index(worker, split)
        first_env = self.split_index * layout.envs_per_split
        self.seeds = [seed + first_env + e for e in range(layout.envs_per_split)]
        self.envs = self.make_envs(registry, first_env)
        obs_space, action_space = self.spaces()
        self.to_env_action = env_action_converter(action_space)
        self.writer = ObsWriter(obs_space)  # packs Dict/Tuple observations

        # numpy views of shared memory: per-step writes without torch dispatch overhead
        self.obs = buffers["obs"].numpy()
        self.actions = buffers["actions"].numpy()
        self.rewards = buffers["rewards"].numpy()
        self.dones = buffers["dones"].numpy()
        self.truncated = buffers["truncated"].numpy()
        self.inactive = buffers["inactive"].numpy()
        self.policy_id = buffers["policy_id"].numpy()
        self.final_obs = buffers.final_obs.numpy()[self.split_index]
        # row T of a finished slot becomes row 0 of the next (sf_core/contracts/sample.py)
        self.carried = [buffers[key].numpy() for key in CARRIED]

        self.free_sets = deque(range(layout.sets_per_split))
        self.faults_in_a_row = 0
        self.slot = -1
        self.t = 0
        rows = layout.rows_per_split
        self.episode_return = np.zeros(rows)
        self.episode_length = np.zeros(rows, dtype=np.int64)
        # one entry per finished agent episode; a multi-agent env's episode once all its agents finished it
        self.finished_episodes: list[Episode] = []
        self.finished_matches: list[Match] = []
        self.finished_objectives: list[tuple[int, float]] = []
        # the env's own episode metrics (sf_core/sampling/episode_metrics.py), and why any value was skipped
        self.finished_metrics: list[Metric] = []
        self.skipped_metrics: dict[str, str] = {}  # key -> reason, since the last report
        # the policy acting for each row, drawn at each of its episode starts (sf_core/sampling/policy_mapping.py)
        self.policies = AgentPolicies(mapping, cfg.num_policies, layout.num_workers * layout.num_splits *
                                      layout.envs_per_split, layout.agents_per_env > 1, seed + 7 * self.split_index)
        self.row_policy = np.zeros(rows, dtype=np.int16)
        self.row_episodes = np.zeros(rows, dtype=np.int64)  # episodes each row's agent started in its env
        self.pending_match: list[list[tuple[int, float] | None]] = [[None] * layout.agents_per_env
                                                                      for _ in range(layout.envs_per_split)]

    # ---------------------------------------------------------------- what a kind of runner defines
    def make_envs(self, registry: EnvRegistry, first_env: int) -> list:
        """The split's envs (`first_env`: the global index of its first)."""
        return [self.make_env(registry, EnvContext(self.worker, first_env + e, s)) for e, s in enumerate(self.seeds)]

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        """The (per-row) observation and action spaces of the split's envs."""
        return self.envs[0].observation_space, self.envs[0].action_space

    def make_env(self, registry: EnvRegistry, ctx: EnvContext):
        # --env_service: envs on the worker's slots; the worker waits, not reset()
        if isinstance(self.pool, PoolGroup):  # named pools: the registered env composes one slot of each
            services = ServiceSet(self.pool)
            composed = registry.make(self.cfg.env, self.cfg, dataclasses.replace(ctx, services=services.envs))
            return ServiceSetEnv(composed, services, acquire_timeout=0.0)
        if self.pool is not None:
            return PooledEnv(self.pool, acquire_timeout=0.0)
        return registry.make(self.cfg.env, self.cfg, ctx)

    def reset(self, slot: int) -> None:
        """Reset every env and start a trajectory in `slot` at row 0 (calls `begin` first)."""
        raise NotImplementedError

    def begin(self, slot: int) -> None:
        """Fresh episodes start in `slot` at row 0: every row draws its policy."""
        self.slot, self.t = slot, 0
        if self.cfg.num_policies > 1:
            for row in range(self.layout.rows_per_split):
                self.row_policy[row] = self._draw_policy(row)
            self.policy_id[slot, 0] = self.row_policy
        for match in self.pending_match:
            match[:] = [None] * len(match)

    def step(self) -> bool:
        """Step every env with the actions in row t; returns whether any row was truncated."""
        raise NotImplementedError

    # ---------------------------------------------------------------- slots
    def env_name(self, e: int) -> str:
        return f"env {self.cfg.env!r} (worker {self.worker}, split {self.split}, env {e})"

    def take_free_slot(self) -> int:
        return self.layout.slot_index(self.worker, self.split, self.free_sets.popleft())

    def restart_episodes(self) -> None:
        """After an env slot failed: drop the trajectory in progress (row 0 of the same slot is written
        again, so none of its rows reach the learner) and start new episodes in every env of the split.
        Envs that lost their slot acquire another; raises EnvStepError if none is free."""
        self.seeds = self.fresh_seeds()
        self.episode_return[:] = 0.0
        self.episode_length[:] = 0
        self.reset(self.slot)

    def let_go_draining(self) -> bool:
        """Envs on a slot being drained give it back (it leaves the pool); whether any did."""
        draining = [env for env in self.envs if getattr(env, "draining", False)]
        for env in draining:
            env.let_go()
        return bool(draining)

    def let_go_slots(self) -> None:
        """Every env gives its slot back (restored), for another split to use while this one waits."""
        for env in self.envs:
            if hasattr(env, "let_go"):
                env.let_go()

    def recreated(self) -> "SplitRunner":
        """Fresh envs for this split, keeping its slot bookkeeping (after an env fault)."""
        fresh = type(self)(*self._args)
        fresh.free_sets = self.free_sets
        fresh.finished_episodes = self.finished_episodes
        fresh.finished_matches = self.finished_matches
        fresh.finished_objectives = self.finished_objectives
        fresh.finished_metrics, fresh.skipped_metrics = self.finished_metrics, self.skipped_metrics
        fresh.row_episodes = self.row_episodes
        fresh.faults_in_a_row = self.faults_in_a_row
        fresh.seeds = self.fresh_seeds()
        return fresh

    def fresh_seeds(self) -> list[int]:
        """Seeds for restarted envs: never those of the interrupted or failed episodes."""
        return [s + 1_000_003 for s in self.seeds]

    def trajectory_complete(self) -> bool:
        return self.t == self.layout.rollout

    def next_slot(self) -> bool:
        """Move to the next free slot, carrying the last row over as row 0; False if none is free."""
        if not self.free_sets:
            return False
        old, self.slot = self.slot, self.take_free_slot()
        T = self.layout.rollout
        for array in self.carried:
            array[self.slot, 0] = array[old, T]
        self.t = 0
        return True

    def release(self, k: int) -> None:
        self.free_sets.append(k)

    # ---------------------------------------------------------------- per step
    def record_episode(self, row: int, reward: float, info: dict, agent: int = 0) -> None:
        """Row `row` ended its episode with this step's `reward`: record it, clear its running totals, and
        draw the policy of the agent's next episode."""
        policy = int(self.row_policy[row])
        outcome = episode_outcome(info, float(self.episode_return[row] + reward), int(self.episode_length[row]) + 1)
        if outcome is not None:
            self.finished_episodes.append((outcome[0], outcome[1], agent, policy))
            self._record_metrics(info, policy)
            if self.layout.agents_per_env > 1:
                self._record_match(row // self.layout.agents_per_env, agent, policy, outcome[0])
        objective = self.cfg.pbt_target_objective
        if objective not in BUILT_IN_OBJECTIVES and objective in info:
            self.finished_objectives.append((policy, float(info[objective])))
        self.episode_return[row] = 0.0
        self.episode_length[row] = 0
        self.row_episodes[row] += 1
        if self.cfg.num_policies > 1:
            self.row_policy[row] = self._draw_policy(row)

    def _record_metrics(self, info: dict, policy: int) -> None:
        for key, value in episode_metrics(info):
            if isinstance(value, float):
                self.finished_metrics.append((policy, key, value))
            else:
                self.skipped_metrics.setdefault(key, value)

    def _draw_policy(self, row: int) -> int:
        A = self.layout.agents_per_env
        env_index = self.split_index * self.layout.envs_per_split + row // A
        return self.policies.choose(env_index, row % A, int(self.row_episodes[row]))

    def _record_match(self, e: int, agent: int, policy: int, episode_return: float) -> None:
        """A match is complete once every agent of env e finished its episode (on one step or several)."""
        pending = self.pending_match[e]
        pending[agent] = (policy, episode_return)
        if all(entry is not None for entry in pending):
            done = [entry for entry in pending if entry is not None]
            self.finished_matches.append((tuple(p for p, _ in done), tuple(r for _, r in done)))
            pending[:] = [None] * len(pending)

    def store_step(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
        """Check and store row t's rewards and flags (the next observations are already in row t+1)."""
        slot, t = self.slot, self.t
        next_obs = self.obs[slot, t + 1]
        if not np.isfinite(rewards).all() or not self.writer.is_finite(next_obs):
            bad = [r for r in range(len(rewards))
                   if not np.isfinite(rewards[r]) or not self.writer.is_finite(next_obs[r])]
            raise EnvStepError(f"{self.env_name(bad[0] // self.layout.agents_per_env)} returned a non-finite "
                               f"observation or reward (reward {rewards[bad[0]]}); refusing to train on it")
        scaled = np.clip(rewards * self.cfg.reward_scale, -self.cfg.reward_clip, self.cfg.reward_clip)
        self.rewards[slot, t] = scaled
        self.dones[slot, t] = terminated
        self.truncated[slot, t] = truncated
        if self.cfg.num_policies > 1:  # rows whose episode ended drew their next policy meanwhile
            self.policy_id[slot, t + 1] = self.row_policy
        self.t = t + 1

    def call(self, e: int, fn: Callable, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EnvContractError as exc:  # the single-agent adapter found what the env returned broken
            raise exc.named(self.env_name(e)) from exc
        except Exception as exc:
            raise EnvStepError(f"{self.env_name(e)} raised in {fn.__name__}(): {type(exc).__name__}: {exc}") from exc

    def raise_if_broken(self, e: int, rule: str | None, error: Exception | None,
                        contract: str = GYMNASIUM_API) -> None:
        """After storing what env e returned failed with `error`: if it broke the env contract (`rule`, from the
        checks of envs/env_check.py, as the runner's check words it), raise that, naming the env; otherwise
        return, for the caller to re-raise `error` (a bug of ours, with its traceback)."""
        if rule is not None:
            raise EnvContractError(rule, self.env_name(e), contract) from error

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing is best effort at shutdown
                pass
