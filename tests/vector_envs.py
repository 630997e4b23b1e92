"""A corridor written twice: as a numpy-batched gymnasium VectorEnv (any autoreset mode) and as a single env with
the same dynamics, registered at import for runs that name this module with --env_module.

Walk right to the end of a corridor of 8 cells from a random start in cells 0-4: a step right pays 0.1, a step
that does not costs 0.1, the goal pays 1 more and ends the episode; 10 steps at most (a time limit: truncated).
Sub-env i of a vector env reset with seed s plays what a single env reset with seed s + i plays."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from sf_core import register_env

CELLS, STARTS, TIME_LIMIT = 8, 5, 10
OBS_SPACE = gym.spaces.Box(0.0, 1.0, (CELLS,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)


def _move(pos, steps, action):
    """One step of the corridor (arrays or scalars): new position, steps, reward, terminated, truncated."""
    new = np.clip(pos + np.where(action == 1, 1, -1), 0, CELLS - 1)
    at_goal = new == CELLS - 1
    reward = np.where(new > pos, 0.1, -0.1) + np.where(at_goal, 1.0, 0.0)
    steps = steps + 1
    return new, steps, reward, at_goal, steps >= TIME_LIMIT


class Corridor(gym.Env):
    observation_space, action_space = OBS_SPACE, ACTION_SPACE

    def _obs(self):
        return np.eye(CELLS, dtype=np.float32)[self.pos]

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.steps = int(self.np_random.integers(STARTS)), 0
        return self._obs(), {}

    def step(self, action):
        self.pos, self.steps, reward, at_goal, cut = _move(self.pos, self.steps, int(action))
        info = {"episode_extra_stats": {"distance": self.pos / (CELLS - 1)}} if at_goal or cut else {}
        return self._obs(), float(reward), bool(at_goal), bool(cut), info


class VectorCorridor(VectorEnv):
    """The corridor's sub-envs stepped as numpy arrays, with one generator per sub-env (as single envs have)."""

    def __init__(self, num_envs: int, mode: AutoresetMode = AutoresetMode.NEXT_STEP):
        self.num_envs, self.metadata = num_envs, {"autoreset_mode": mode}
        self.single_observation_space, self.single_action_space = OBS_SPACE, ACTION_SPACE
        self.observation_space = batch_space(OBS_SPACE, num_envs)
        self.action_space = batch_space(ACTION_SPACE, num_envs)
        self.rngs = [np.random.default_rng() for _ in range(num_envs)]
        self.pos = np.zeros(num_envs, np.int64)
        self.steps = np.zeros(num_envs, np.int64)
        self.pending = np.zeros(num_envs, bool)  # NEXT_STEP: ended on the last step, reset on this one

    def _restart(self, mask):
        for i in np.flatnonzero(mask):
            self.pos[i], self.steps[i] = self.rngs[i].integers(STARTS), 0

    def reset(self, *, seed=None, options=None):
        mask = np.ones(self.num_envs, bool) if not options or "reset_mask" not in options else options["reset_mask"]
        if seed is not None:  # sub-env i plays seed + i
            self.rngs = [np.random.default_rng(seed + i) for i in range(self.num_envs)]
        self._restart(mask)
        self.pending[mask] = False
        return np.eye(CELLS, dtype=np.float32)[self.pos], {}

    def step(self, actions):
        mode = self.metadata["autoreset_mode"]
        pos, steps, reward, at_goal, cut = _move(self.pos, self.steps, np.asarray(actions))
        waiting = self.pending.copy()
        self.pos, self.steps = np.where(waiting, self.pos, pos), np.where(waiting, self.steps, steps)
        reward, at_goal, cut = np.where(waiting, 0.0, reward), at_goal & ~waiting, cut & ~waiting
        ended = at_goal | cut
        info = {}
        if ended.any():
            info = {"episode_extra_stats": {"distance": self.pos / (CELLS - 1), "_distance": ended},
                    "_episode_extra_stats": ended}
        final = np.eye(CELLS, dtype=np.float32)[self.pos]
        if mode == AutoresetMode.NEXT_STEP:
            self._restart(waiting)
            self.pending = ended
        elif mode == AutoresetMode.SAME_STEP and ended.any():
            self._restart(ended)
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(ended):
                final_obs[i] = final[i]
            info = {"final_obs": final_obs, "_final_obs": ended, "final_info": info, "_final_info": ended}
        obs = np.eye(CELLS, dtype=np.float32)[self.pos]
        return obs, reward, at_goal, cut, info


def make_corridor(name, cfg, ctx):  # module level: worker processes import them by name
    return Corridor()


def make_vector_corridor(name, cfg, ctx):
    return VectorCorridor(ctx.num_envs)


register_env("Corridor1-v0", make_corridor)
register_env("VectorCorridor-v0", make_vector_corridor, vectorized=True)
