"""A two-player zero-sum game with skill: race to 21 (`--env=nim21`, a Nim variant).

Two players share a running total that starts at 0. They take turns adding 1, 2 or 3 (`max_add`) to
it; whoever brings the total to 21 (`target`) or beyond wins (+1) and the other loses (-1). Who moves
first is drawn per episode from the env's seeded generator, so a policy learns both seats.

Under the multi-agent contract (envs/multi_agent.py) every agent acts on every step: the player to
move chooses, the waiting player gets a no-op step (its action is ignored, its reward 0). Every
action of `Discrete(max_add)` is legal (action a adds a + 1), so no choice can break the game.

Observation of each agent, `Box(0, 1, (target + 1,))`: the running total one-hot (indices 0 to
target - 1) and, last, 1.0 if it is this agent's turn. The game has a known solution: the player who
leaves a total t with (target - t) % (max_add + 1) == 0 wins, so with 21 and 1..3 the first player
wins by leaving 1, 5, 9, 13, 17. A uniformly random player almost never finds that line: it beats a
perfect player only from the first seat and by hitting all six of those totals (1 game in 3^6 = 729
there), so a trained policy should win nearly every game against one. Episodes last 7 to 21 steps.

It renders `rgb_array` frames: a row of `target` cells, filled up to the total, above a band in the
colour of the player to move.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from sf_core.envs.multi_agent import MultiAgentEnv

if TYPE_CHECKING:
    from sf_core.config import Config

CELL = 12
PLAYER_COLOURS = ((230, 80, 60), (60, 140, 230))


class Nim(MultiAgentEnv):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 2}

    def __init__(self, target: int = 21, max_add: int = 3, render_mode: str | None = None):
        if target < 2 or max_add < 1:
            raise ValueError(f"Nim needs target >= 2 and max_add >= 1, got {target}, {max_add}")
        self.num_agents = 2
        self.target, self.max_add, self.render_mode = target, max_add, render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (target + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(max_add)
        self.total, self.to_move = 0, 0

    def _observations(self) -> list[np.ndarray]:
        obs = []
        for agent in range(2):
            o = np.zeros(self.target + 1, np.float32)
            o[self.total] = 1.0
            o[-1] = float(agent == self.to_move)
            obs.append(o)
        return obs

    def _new_game(self) -> list[np.ndarray]:
        self.total = 0
        self.to_move = int(self.np_random.integers(2))
        return self._observations()

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list, list[dict]]:
        super().reset(seed=seed)
        return self._new_game(), [{}, {}]

    def step(self, actions: Sequence[Any]) -> tuple[list, list[float], list[bool], list[bool], list[dict]]:
        mover = self.to_move
        # clipped, not refused: an out-of-range action (a stray float, a negative) still plays a legal move
        self.total += int(np.clip(int(actions[mover]), 0, self.max_add - 1)) + 1
        if self.total >= self.target:
            rewards = [1.0 if agent == mover else -1.0 for agent in range(2)]
            obs = self._new_game()  # auto-reset: the returned observations start the next game
            return obs, rewards, [True, True], [False, False], [{}, {}]
        self.to_move = 1 - mover
        return self._observations(), [0.0, 0.0], [False, False], [False, False], [{}, {}]

    def winning_action(self, total: int) -> int | None:
        """The action that wins from `total` against any reply (reach the target, or leave a total t
        with (target - t) % (max_add + 1) == 0); None from a total that loses against perfect play."""
        for action in range(self.max_add):
            after = total + action + 1
            if after >= self.target or (self.target - after) % (self.max_add + 1) == 0:
                return action
        return None

    def render(self) -> np.ndarray:
        frame = np.full((2 * CELL, self.target * CELL, 3), 30, np.uint8)
        frame[:CELL, :self.total * CELL] = (230, 230, 230)
        frame[CELL:] = PLAYER_COLOURS[self.to_move]
        return frame


def make_nim(name: str, cfg: Config | None, ctx: Any) -> Nim:
    """The factory behind the built-in name `nim21` (signature of `register_env` factories)."""
    return Nim(render_mode=getattr(ctx, "render_mode", None))
