"""An example two-agent env: each agent must name a target that only the other agent can see.

A cooperative signalling game (a Lewis game) for self-play with one shared policy. Each episode has
two steps:

1. "speak": every agent sees the target of the other agent (one of `num_targets`) and acts;
2. "guess": every agent sees what the other one said on step 1 and acts again.

Both agents get the team reward on step 2: the fraction of agents whose guess equals their own
target. Random play scores 1 / num_targets per episode, the best protocol (say the target you see,
guess what you hear) scores 1. Nothing but the other agent's action carries an agent's target, so
the reward is reached only if the rows of both agents go to the right places.

It follows the multi-agent contract of envs/multi_agent.py (auto-reset, per-agent lists) and renders
`rgb_array` frames: one band per agent, its target in green, its last action in white.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import gymnasium as gym
import numpy as np

from sf_core.envs.multi_agent import MultiAgentEnv

if TYPE_CHECKING:
    from sf_core.config import Config

CELL = 16


class RelayGame(MultiAgentEnv):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 2}

    def __init__(self, num_targets: int = 4, render_mode: str | None = None):
        self.num_agents = 2
        self.num_targets = num_targets
        self.render_mode = render_mode
        # [what I see (a target or a word) one-hot, phase: speak / guess]
        self.observation_space = gym.spaces.Box(0.0, 1.0, (num_targets + 2,), np.float32)
        self.action_space = gym.spaces.Discrete(num_targets)
        self.targets = np.zeros(2, dtype=np.int64)
        self.said = np.zeros(2, dtype=np.int64)
        self.last_actions = np.full(2, -1, dtype=np.int64)
        self.phase = 0

    def _observations(self) -> list[np.ndarray]:
        obs = []
        for i in range(2):
            other = 1 - i
            seen = self.targets[other] if self.phase == 0 else self.said[other]
            o = np.zeros(self.num_targets + 2, np.float32)
            o[seen] = 1.0
            o[self.num_targets + self.phase] = 1.0
            obs.append(o)
        return obs

    def _new_episode(self) -> list[np.ndarray]:
        self.targets = self.np_random.integers(self.num_targets, size=2)
        self.phase = 0
        return self._observations()

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list, list[dict]]:
        super().reset(seed=seed)
        self.last_actions[:] = -1
        return self._new_episode(), [{}, {}]

    def step(self, actions: Sequence[Any]) -> tuple[list, list[float], list[bool], list[bool], list[dict]]:
        actions = np.asarray([int(a) for a in actions])
        self.last_actions = actions
        if self.phase == 0:
            self.said = actions
            self.phase = 1
            return self._observations(), [0.0, 0.0], [False, False], [False, False], [{}, {}]
        team = float(np.mean(actions == self.targets))
        obs = self._new_episode()  # auto-reset: the returned observations start the next episode
        return obs, [team, team], [True, True], [False, False], [{}, {}]

    def render(self) -> np.ndarray:
        frame = np.zeros((2 * CELL * 2, self.num_targets * CELL, 3), np.uint8)
        for i in range(2):
            band = frame[i * 2 * CELL:(i + 1) * 2 * CELL]
            band[:CELL, self.targets[i] * CELL:(self.targets[i] + 1) * CELL] = (40, 200, 60)
            if self.last_actions[i] >= 0:
                a = self.last_actions[i]
                band[CELL:, a * CELL:(a + 1) * CELL] = (230, 230, 230)
        return frame


def make_relay_game(name: str, cfg: Config, ctx: Any) -> RelayGame:
    """Factory for `register_env`: `register_env("RelayGame-v0", make_relay_game)`."""
    return RelayGame(render_mode=ctx.render_mode)
