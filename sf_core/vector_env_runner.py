"""One split of a rollout worker: a group of envs stepped together into the split's current slot.

The runner owns per-env episode bookkeeping and the switch from one trajectory slot to the next;
it never waits for anything itself (the RolloutWorker decides when it may step).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from algo.observations import ObsWriter
from envs.env_pool import EnvPool, PooledEnv
from envs.registry import EnvContext, EnvRegistry
from sf_core.buffers import BufferLayout, TrajectoryBuffers


class EnvStepError(RuntimeError):
    pass


def env_action_converter(space: gym.Space) -> Callable[[np.ndarray], Any]:
    """Policy outputs (as stored in buffers) to what env.step expects."""
    if isinstance(space, gym.spaces.Discrete):
        start = int(space.start)
        return lambda a: int(a) + start
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = np.asarray(space.start).ravel()
        return lambda a: (a.astype(np.int64) + start).reshape(space.nvec.shape)
    if isinstance(space, gym.spaces.Box):
        low, high = space.low, space.high
        return lambda a: np.clip(a, low, high).astype(space.dtype)
    raise ValueError(f"unsupported action space {space}")


class VectorEnvRunner:
    def __init__(self, cfg, worker: int, split: int, registry: EnvRegistry, buffers: TrajectoryBuffers,
                 layout: BufferLayout, seed: int, pool: EnvPool | None = None):
        self._args = (cfg, worker, split, registry, buffers, layout, seed, pool)
        self.cfg, self.worker, self.split = cfg, worker, split
        self.layout = layout
        self.split_index = layout.split_index(worker, split)
        E = layout.envs_per_split
        first_env = self.split_index * E
        if pool is not None:  # --env_service: envs on the worker's slots; the worker waits, not reset()
            self.envs = [PooledEnv(pool, acquire_timeout=0.0) for _ in range(E)]
        else:
            self.envs = [registry.make(cfg.env, cfg, EnvContext(worker, first_env + e, seed + first_env + e))
                         for e in range(E)]
        self.seeds = [seed + first_env + e for e in range(E)]
        self.to_env_action = env_action_converter(self.envs[0].action_space)
        self.writer = ObsWriter(self.envs[0].observation_space)  # packs Dict/Tuple observations

        # numpy views of shared memory: per-step writes without torch dispatch overhead
        self.obs = buffers.obs.numpy()
        self.actions = buffers.actions.numpy()
        self.rewards = buffers.rewards.numpy()
        self.dones = buffers.dones.numpy()
        self.truncated = buffers.truncated.numpy()
        self.final_obs = buffers.final_obs.numpy()[self.split_index]
        self.carried = [getattr(buffers, key).numpy() for key in ("obs", "actions", "log_prob", "values",
                                                                  "policy_version", "rnn_states")]

        self.free_sets = deque(range(layout.sets_per_split))
        self.faults_in_a_row = 0
        self.slot = -1
        self.t = 0
        self.episode_return = np.zeros(E)
        self.episode_length = np.zeros(E, dtype=np.int64)
        self.finished_episodes: list[tuple[float, int]] = []

    def env_name(self, e: int) -> str:
        return f"env {self.cfg.env!r} (worker {self.worker}, split {self.split}, env {e})"

    def take_free_slot(self) -> int:
        return self.layout.slot_index(self.worker, self.split, self.free_sets.popleft())

    def reset(self, slot: int) -> None:
        """Reset every env and start a trajectory in `slot` at row 0."""
        self.slot, self.t = slot, 0
        for e, env in enumerate(self.envs):
            obs, _ = self._call(e, env.reset, seed=self.seeds[e])
            self.writer.write(obs, self.obs[self.slot, 0, e])

    def restart_episodes(self) -> None:
        """After an env slot failed: drop the trajectory in progress (row 0 of the same slot is written
        again, so none of its rows reach the learner) and start new episodes in every env of the split.
        Envs that lost their slot acquire another; raises EnvStepError if none is free."""
        self.seeds = [s + 1_000_003 for s in self.seeds]  # do not replay the interrupted episodes
        self.episode_return[:] = 0.0
        self.episode_length[:] = 0
        self.reset(self.slot)

    def recreated(self) -> "VectorEnvRunner":
        """Fresh envs for this split, keeping its slot bookkeeping (after an env fault)."""
        fresh = VectorEnvRunner(*self._args)
        fresh.free_sets = self.free_sets
        fresh.finished_episodes = self.finished_episodes
        fresh.faults_in_a_row = self.faults_in_a_row
        fresh.seeds = [s + 1_000_003 for s in self.seeds]  # do not replay the episode that failed
        return fresh

    def trajectory_complete(self) -> bool:
        return self.t == self.layout.rollout

    def next_slot(self) -> bool:
        """Move to the next free slot, carrying the last row over as row 0; False if none is free."""
        if not self.free_sets:
            return False
        old, self.slot = self.slot, self.layout.slot_index(self.worker, self.split, self.free_sets.popleft())
        T = self.layout.rollout
        for array in self.carried:
            array[self.slot, 0] = array[old, T]
        self.t = 0
        return True

    def release(self, k: int) -> None:
        self.free_sets.append(k)

    def step(self) -> bool:
        """Step every env with the actions in row t; returns whether any env was truncated."""
        slot, t = self.slot, self.t
        actions = self.actions[slot, t]
        rewards = np.empty(len(self.envs), dtype=np.float64)
        terminated = np.zeros(len(self.envs), dtype=bool)
        truncated = np.zeros(len(self.envs), dtype=bool)
        next_obs = self.obs[slot, t + 1]
        for e, env in enumerate(self.envs):
            obs, reward, term, trunc, info = self._call(e, env.step, self.to_env_action(actions[e]))
            rewards[e] = reward
            if term or trunc:
                if "episode_return" not in info:
                    self.finished_episodes.append((float(self.episode_return[e] + reward),
                                                   int(self.episode_length[e]) + 1))
                elif info["episode_return"] is not None:  # the env's own statistics (Atari: whole games)
                    self.finished_episodes.append((float(info["episode_return"]), int(info["episode_length"])))
                self.episode_return[e] = 0.0
                self.episode_length[e] = 0
                if trunc and not term:  # the value of this final state bootstraps the cut episode
                    truncated[e] = True
                    self.writer.write(obs, self.final_obs[e])
                terminated[e] = term
                obs, _ = self._call(e, env.reset)
            else:
                self.episode_return[e] += reward
                self.episode_length[e] += 1
            self.writer.write(obs, next_obs[e])

        if not np.isfinite(rewards).all() or not self.writer.is_finite(next_obs):
            bad = [e for e in range(len(self.envs))
                   if not np.isfinite(rewards[e]) or not self.writer.is_finite(next_obs[e])]
            raise EnvStepError(f"{self.env_name(bad[0])} returned a non-finite observation or reward "
                               f"(reward {rewards[bad[0]]}); refusing to train on it")
        scaled = np.clip(rewards * self.cfg.reward_scale, -self.cfg.reward_clip, self.cfg.reward_clip)
        self.rewards[slot, t] = scaled
        self.dones[slot, t] = terminated
        self.truncated[slot, t] = truncated
        self.t = t + 1
        return bool(truncated.any())

    def _call(self, e: int, fn: Callable, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise EnvStepError(f"{self.env_name(e)} raised in {fn.__name__}(): {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing is best effort at shutdown
                pass
