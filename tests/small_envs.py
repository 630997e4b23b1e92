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


def make_short_image_corridor(name, cfg, ctx):
    """The image corridor of 20 cells (5×5 images): a random policy reaches its goal once in 2^20 episodes,
    and its CNNs cost less per frame than the 30-cell corridor's (6×6) in the suite's learning test."""
    from sf_core.envs.corridor import CorridorEnv

    return CorridorEnv(length=20, image=True)


register_env("CorridorImage20-v0", make_short_image_corridor)
