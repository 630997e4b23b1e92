"""A hard-exploration task for curiosity-driven algorithms: `--env=sf_core/Corridor-v0`.

The agent walks down a corridor of `length` cells, starting in cell 0. In every cell exactly one
action moves it one cell forward; any other action ends the episode with reward 0. Stepping forward
from the last cell reaches the goal: reward 1, and the episode ends. Which action is the right one
differs from cell to cell, drawn once from a table seeded with `table_seed`, so every instance (every
env of every worker) is the same corridor. The observation is the one-hot index of the current cell.

Why it is hard: the only reward is at the end, and a policy that picks its actions at random reaches
it with probability num_actions ** -length (2 ** -30, about one episode in a billion, by default).
Until it has seen that reward a policy-gradient method has nothing to learn from, so plain APPO keeps
dying in the first cells. An exploration bonus for unfamiliar cells (RND: `--algo=APPO_RND`,
`algo/rnd.py`) pays the agent for getting one cell further than before, and leads it to the goal.

Episodes are also cut (truncated) after `max_steps` steps. Every step moves forward or ends the
episode, so the default (2 × length) never binds; a smaller value cuts the walk short.

`--env=sf_core/CorridorImage-v0` is the same corridor seen as a picture: a 1×S×S uint8 image (S the
smallest side with S² ≥ length) with the current cell's pixel lit (255), row by row. It is what an agent
with a conv encoder explores, RND's networks included (algo/rnd_networks.py).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class CorridorEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 30, num_actions: int = 2, table_seed: int = 0, max_steps: int | None = None,
                 image: bool = False):
        if length < 1 or num_actions < 2:
            raise ValueError(f"Corridor: need length >= 1 and num_actions >= 2, got {length} and {num_actions}")
        self.length, self.num_actions = length, num_actions
        self.max_steps = 2 * length if max_steps is None else max_steps
        # the right action of each cell: fixed by table_seed, not by the episode seed
        self.right_actions = np.random.default_rng(table_seed).integers(num_actions, size=length)
        self.side = int(np.ceil(np.sqrt(length))) if image else 0
        if image:
            self.observation_space = gym.spaces.Box(0, 255, (1, self.side, self.side), np.uint8)
        else:
            self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(num_actions)
        self.cell, self.t = 0, 0

    def _obs(self) -> np.ndarray:
        if self.side:
            image = np.zeros((1, self.side, self.side), dtype=np.uint8)
            image[0, self.cell // self.side, self.cell % self.side] = 255
            return image
        obs = np.zeros(self.length, dtype=np.float32)
        obs[self.cell] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.cell, self.t = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        if int(action) != self.right_actions[self.cell]:
            return self._obs(), 0.0, True, False, {}  # a wrong turn: the episode is over, no reward
        if self.cell == self.length - 1:
            return self._obs(), 1.0, True, False, {}  # out of the last cell: the goal
        self.cell += 1
        return self._obs(), 0.0, False, self.t >= self.max_steps, {}


gym.register("sf_core/Corridor-v0", entry_point=CorridorEnv)
gym.register("sf_core/CorridorImage-v0", entry_point=CorridorEnv, kwargs={"image": True})
