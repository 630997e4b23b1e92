"""A `VectorEnv` of one sub-env, seen as a plain `gymnasium.Env`.

A user's env registered with `register_env(..., vectorized=True)` may exist only as a vector env. Wherever
sf_core plays one env at a time (the runner's probe and --check_env, `sf_core.enjoy`, evaluation, the per-env
path of --env_vectorization=none) it makes a vector env of one and steps it through this adapter: the spaces are
the vector env's `single_observation_space` / `single_action_space`, and a step that ends an episode returns
that episode's last observation and info whatever the env's autoreset mode; the caller resets before the next
step, as with any gymnasium env (after a same-step autoreset, a reset without seed or options takes the episode
the env already started).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from sf_core.envs.vector_api import autoreset_mode, env_info, env_row


class VectorOfOne(gym.Env):
    def __init__(self, vector_env: VectorEnv):
        if vector_env.num_envs != 1:
            raise ValueError(f"VectorOfOne adapts a vector env of 1 env, got {vector_env.num_envs}")
        self.vector_env = vector_env
        self.observation_space = vector_env.single_observation_space
        self.action_space = vector_env.single_action_space
        self.metadata = dict(getattr(vector_env, "metadata", {}))
        self.render_mode = getattr(vector_env, "render_mode", None)
        self.same_step = autoreset_mode(vector_env) == AutoresetMode.SAME_STEP
        self.next_episode: tuple[Any, dict] | None = None  # SAME_STEP: the reset a step's episode end made

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        started, self.next_episode = self.next_episode, None
        if started is not None and seed is None and options is None:  # that reset is this one: not another
            return started
        obs, info = self.vector_env.reset(seed=seed, options=options)
        return env_row(obs, 0), env_info(info, 0)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, rewards, terminated, truncated, info = self.vector_env.step(np.expand_dims(np.asarray(action), 0))
        self.next_episode = None
        if (terminated[0] or truncated[0]) and self.same_step:  # its episode's end is in the info
            self.next_episode = env_row(obs, 0), env_info(info, 0)
            return (info["final_obs"][0], float(rewards[0]), bool(terminated[0]), bool(truncated[0]),
                    env_info(info.get("final_info", {}), 0))
        return env_row(obs, 0), float(rewards[0]), bool(terminated[0]), bool(truncated[0]), env_info(info, 0)

    def render(self) -> Any:
        frames = self.vector_env.render()
        return None if frames is None else frames[0]

    def close(self) -> None:
        self.vector_env.close()
