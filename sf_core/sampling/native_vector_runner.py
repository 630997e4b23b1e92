"""A split that is one natively vectorized env (--env_vectorization, envs/vector_backends.py).

The split's `envs_per_split` envs are the sub-envs of one `gymnasium.vector.VectorEnv`, one row each, reset and
stepped with one call; each observation batch is written into the shared trajectory buffer with one array
assignment. Rewards and flags are stored, and episode statistics kept, as for a split of single envs; a
time-limited episode's last observation goes to the split's final observations, so its value bootstraps.

How an ended sub-env starts its next episode depends on the env's autoreset mode (envs/vector_api.py):

- SAME_STEP: the step that ends an episode returns the next episode's first observation (the last one is in
  `info["final_obs"]`, its info in `info["final_info"]`): the rows are those of single envs.
- NEXT_STEP (gymnasium's default; CartPoleVectorEnv's only mode): the step that ends an episode returns its last
  observation, and the next step ignores the sub-env's action and returns the first observation of a new
  episode with reward 0. Row t+1 then holds the last observation and is marked `inactive` (no sample: the
  learner masks it out, as a multi-agent env's waiting agent); its own step is stored with reward 0 and a done,
  so GAE and the recurrent state never carry across it, and it counts in no episode's return or length. Like
  every row it counts as a frame (rows are the unit the rollout worker counts, for multi-agent envs too).
- DISABLED: the runner resets the ended sub-envs itself, `reset(options={"reset_mask": ended})`, and writes
  the batch that reset returns over the step's.
"""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from sf_core.envs.env_check import EnvContractError
from sf_core.envs.registry import EnvRegistry, VectorEnvContext
from sf_core.envs.vector_api import autoreset_mode, env_info
from sf_core.envs.vector_backends import vector_backend
from sf_core.sampling.split_runner import STORE_ERRORS, EnvStepError, SplitRunner, env_action_converter

VECTOR_ENV_API = "the gymnasium VectorEnv API"


class NativeVectorRunner(SplitRunner):
    def make_envs(self, registry: EnvRegistry, first_env: int) -> list:
        backend = vector_backend(self.cfg, registry)
        if backend is None:  # the worker picks this kind only where a backend serves the env
            raise ValueError(f"no vector env backend serves env {self.cfg.env!r}")
        n = self.layout.envs_per_split
        env = backend.make(self.cfg.env, self.cfg, VectorEnvContext(self.worker, first_env, n, tuple(self.seeds)),
                           registry)
        if not isinstance(env, VectorEnv) or env.num_envs != n:
            raise ValueError(f"the {backend.name} backend made {type(env).__name__} for env {self.cfg.env!r}, "
                             f"not a VectorEnv of {n} envs")
        self.env = env
        self.ends: Callable[..., None] = {AutoresetMode.NEXT_STEP: self._next_step_ends,
                                          AutoresetMode.SAME_STEP: self._same_step_ends,
                                          AutoresetMode.DISABLED: self._disabled_ends}[autoreset_mode(env)]
        return [env]

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        space = self.env.single_action_space
        self.to_env_actions = env_action_converter(space, self.layout.envs_per_split)
        return self.env.single_observation_space, space

    def vector_env_name(self) -> str:
        return (f"env {self.cfg.env!r} (worker {self.worker}, split {self.split}, a vector env of "
                f"{self.layout.envs_per_split})")

    def _call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise EnvStepError(f"{self.vector_env_name()} raised in {fn.__name__}(): {type(exc).__name__}: "
                               f"{exc}") from exc

    def reset(self, slot: int) -> None:
        self.begin(slot)
        # an int seed: sub-env i plays seed + i, the seed of the env it stands for (envs/registry.py)
        result = self._call(self.env.reset, seed=self.seeds[0])
        try:
            obs, _ = result
            self.writer.write_batch(obs, self.obs[slot, 0])
        except STORE_ERRORS as exc:
            self._raise_if_broken("reset", result, exc)
            raise
        self.inactive[slot, 0] = False  # (a carried row may have been waiting for its reset)

    def step(self) -> bool:
        slot, t, n = self.slot, self.t, self.layout.envs_per_split
        result = self._call(self.env.step, self.to_env_actions(self.actions[slot, t]))
        next_obs = self.obs[slot, t + 1]
        try:
            obs, reward, term, trunc, info = result
            rewards = np.array(reward, dtype=np.float64).reshape(n)
            terminated = np.array(term, dtype=bool).reshape(n)
            truncated = np.array(trunc, dtype=bool).reshape(n) & ~terminated
            self.writer.write_batch(obs, next_obs)
            ended = terminated | truncated
            self.ends(ended, rewards, terminated, truncated, info)
        except STORE_ERRORS as exc:
            self._raise_if_broken("step", result, exc)
            raise
        acting = ~ended & ~self.inactive[slot, t]
        self.episode_return[acting] += rewards[acting]
        self.episode_length[acting] += 1
        self.store_step(rewards, terminated, truncated)
        return bool(truncated.any())

    def _record(self, ended: np.ndarray, rewards: np.ndarray, info: dict) -> None:
        for e in np.flatnonzero(ended).tolist():
            self.record_episode(e, float(rewards[e]), env_info(info, e))

    def _next_step_ends(self, ended: np.ndarray, rewards: np.ndarray, terminated: np.ndarray,
                        truncated: np.ndarray, info: dict) -> None:
        slot, t = self.slot, self.t
        resetting = self.inactive[slot, t]  # their episode ended on the step before: this one reset them
        if resetting.any():
            rewards[resetting] = 0.0
            ended[resetting] = truncated[resetting] = False
            terminated[resetting] = True  # the gap row ends an "episode" of its own: nothing chains across it
        self._record(ended, rewards, info)
        for e in np.flatnonzero(truncated).tolist():  # its last observation is row t+1 already
            self.final_obs[e] = self.obs[slot, t + 1, e]
        self.inactive[slot, t + 1] = ended

    def _same_step_ends(self, ended: np.ndarray, rewards: np.ndarray, terminated: np.ndarray,
                        truncated: np.ndarray, info: dict) -> None:
        if not ended.any():
            return
        self._record(ended, rewards, info.get("final_info", {}))
        for e in np.flatnonzero(truncated).tolist():
            if "final_obs" not in info:
                raise EnvStepError(f"{self.env_name(e)} truncated an episode without info['final_obs']: a vector "
                                   f"env that resets on the same step must hand over the episode's last observation")
            self.writer.write(info["final_obs"][e], self.final_obs[e])

    def _disabled_ends(self, ended: np.ndarray, rewards: np.ndarray, terminated: np.ndarray,
                       truncated: np.ndarray, info: dict) -> None:
        if not ended.any():
            return
        self._record(ended, rewards, info)
        next_obs = self.obs[self.slot, self.t + 1]
        for e in np.flatnonzero(truncated).tolist():
            self.final_obs[e] = next_obs[e]
        obs, _ = self._call(self.env.reset, options={"reset_mask": ended.copy()})
        self.writer.write_batch(obs, next_obs)  # the sub-envs not reset keep the observation they had

    def _raise_if_broken(self, call: str, result: Any, error: Exception) -> None:
        """Storing what the env's `call` returned failed with `error`: raise the VectorEnv rule it broke, if any
        (otherwise the caller re-raises `error`, a bug of ours)."""
        rule = batch_rule(call, result, self.layout.envs_per_split, self.env.single_observation_space)
        if rule is not None:
            raise EnvContractError(rule, self.vector_env_name(), VECTOR_ENV_API) from error


def batch_rule(call: str, result: Any, n: int, space: gym.Space) -> str | None:
    """What a VectorEnv of `n` envs broke in what its `call` ("reset" or "step") returned, or None."""
    fields = 2 if call == "reset" else 5
    if not isinstance(result, tuple) or len(result) != fields:
        returns = "(obs, info)" if call == "reset" else "(obs, rewards, terminated, truncated, info)"
        return f"{call}() must return {returns}, got {type(result).__name__}"
    if not isinstance(result[-1], dict):
        return f"{call}() must return a dict of info (vectorized), got {type(result[-1]).__name__}"
    for name, value in zip(("rewards", "terminated", "truncated"), result[1:4]):
        if np.shape(value) != (n,):
            return f"step() must return {name} of shape ({n},), one per env, got shape {np.shape(value)}"
    if isinstance(space, gym.spaces.Box) and np.shape(result[0]) != (n, *space.shape):
        return (f"{call}() must return a batch of observations of shape {(n, *space.shape)}, got shape "
                f"{np.shape(result[0])}")
    return None
