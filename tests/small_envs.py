"""Small custom envs registered at import, for runs that name this module with --env_module."""

import gymnasium as gym
import numpy as np

from sf_core import register_env


class GuessTheSign(gym.Env):
    """Say whether the observation is positive: 1 for a right guess, 20 guesses an episode (chance: 10)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.x = 0, self.np_random.uniform(-1, 1, (1,)).astype(np.float32)
        return self.x, {}

    def step(self, action):
        reward = float(action == int(self.x[0] > 0))
        self.t, self.x = self.t + 1, self.np_random.uniform(-1, 1, (1,)).astype(np.float32)
        return self.x, reward, False, self.t >= 20, {}


def make_guess_the_sign(name, cfg, ctx):
    return GuessTheSign()


register_env("GuessTheSign-v0", make_guess_the_sign)
