"""Small-image envs for the conv-encoder tests: the right action is readable from the image.

Each episode is one step. One pixel is lit at a random place; the answer depends on which half of
the image (left or right) holds it. Random play scores the chance level given in each class.
Factories are module-level so that worker processes can import them.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sf_core.envs.registry import EnvContext
from sf_core.config import Config


def lit_pixel(rng: np.random.Generator, shape: tuple[int, int, int]) -> tuple[np.ndarray, int]:
    """A uint8 [C, H, W] image with one pixel at 255, and 1 if that pixel is in the right half."""
    channels, height, width = shape
    image = np.zeros(shape, dtype=np.uint8)
    right = int(rng.integers(2))
    half = width // 2
    column = int(rng.integers(half)) + right * half
    image[int(rng.integers(channels)), int(rng.integers(height)), column] = 255
    return image, right


class LitPixelEnv(gym.Env):
    """A 1×8×8 image; action 1 if the lit pixel is in the right half, else 0. Chance: 0.5."""

    SHAPE = (1, 8, 8)

    def __init__(self, seed: int | None = None):
        self.observation_space = gym.spaces.Box(0, 255, self.SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.answer = 0
        self._seed = seed

    def _observe(self) -> np.ndarray:
        image, self.answer = lit_pixel(self.np_random, self.SHAPE)
        return image

    def reset(self, *, seed=None, options=None):
        super().reset(seed=self._seed if seed is None else seed)
        self._seed = None
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == self.answer)
        return self._observe(), reward, True, False, {}


class MinimapDictEnv(LitPixelEnv):
    """A Dict of a 3×16×16 minimap and a 1-dim vector; the answer is 2 × (pixel on the right) +
    (vector positive), one of 4 actions. Chance: 0.25; either field alone at most 0.5."""

    SHAPE = (3, 16, 16)

    def __init__(self, seed: int | None = None):
        super().__init__(seed)
        self.observation_space = gym.spaces.Dict({
            "minimap": gym.spaces.Box(0, 255, self.SHAPE, np.uint8),
            "vector": gym.spaces.Box(-1, 1, (1,), np.float32),
        })
        self.action_space = gym.spaces.Discrete(4)

    def _observe(self) -> dict:
        image, right = lit_pixel(self.np_random, self.SHAPE)
        positive = int(self.np_random.integers(2))
        self.answer = 2 * right + positive
        return {"minimap": image, "vector": np.array([1.0 if positive else -1.0], np.float32)}


def make_lit_pixel(name: str, cfg: Config, ctx: EnvContext) -> gym.Env:
    return LitPixelEnv(seed=ctx.seed)


def make_minimap_dict(name: str, cfg: Config, ctx: EnvContext) -> gym.Env:
    return MinimapDictEnv(seed=ctx.seed)
