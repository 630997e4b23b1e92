"""A memory task for recurrent policies: `--env=sf_core/MemoryCue-v0`.

One of `num_cues` cues is shown at the first step only; after `delay` blank steps the agent must
name it. Reward 1 for the right cue at the decision step, 0 otherwise, so a policy without memory
cannot expect more than 1 / num_cues, while one that remembers gets 1. The observation is the
one-hot cue (zeros after the first step) plus a flag that is 1 at the decision step.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class MemoryCueEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, num_cues: int = 4, delay: int = 5, render_mode: str | None = None):
        self.num_cues, self.delay, self.render_mode = num_cues, delay, render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (num_cues + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(num_cues)
        self.cue, self.t = 0, 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.num_cues + 1, dtype=np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        if self.t == self.delay:
            obs[-1] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(self.num_cues)), 0
        return self._obs(), {}

    def step(self, action):
        if self.t < self.delay:
            self.t += 1
            return self._obs(), 0.0, False, False, {}
        return self._obs(), float(int(action) == self.cue), True, False, {}

    def render(self) -> np.ndarray:
        """The cue as a coloured bar while it is shown, grey while the agent has to remember it."""
        frame = np.full((64, 64 * self.num_cues, 3), 96, dtype=np.uint8)
        if self.t == 0:
            frame[:, 64 * self.cue:64 * (self.cue + 1)] = (255, 200, 0)
        return frame


gym.register("sf_core/MemoryCue-v0", entry_point=MemoryCueEnv)
