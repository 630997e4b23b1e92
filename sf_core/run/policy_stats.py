"""One policy's part of the run's statistics (`TrainingStats`, sf_core/run/stats.py); its own checkpoint keeps it."""

from __future__ import annotations

from collections import deque

import numpy as np


class PolicyStats:
    """What one policy of several reached: its episodes, training progress and learner statistics."""

    def __init__(self, window: int):
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        self.objectives: deque[float] = deque(maxlen=window)  # --pbt_target_objective from the env's infos
        self.episodes = 0
        self.samples_trained = 0
        self.version = 0
        self.learner: dict[str, float] = {}
        self.best_mean_return = float("-inf")
        self.mean_return_at_target: float | None = None  # this policy's mean when every policy met it

    def mean_return(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

    def state(self) -> dict:
        return {"episodes": self.episodes, "samples_trained": self.samples_trained, "policy_version": self.version,
                "mean_return": self.mean_return(), "best_mean_return": float(self.best_mean_return),
                "recent_returns": [float(r) for r in self.returns], "recent_lengths": [int(n) for n in self.lengths]}

    def restore(self, state: dict) -> None:
        self.episodes, self.samples_trained = state["episodes"], state["samples_trained"]
        self.version = state["policy_version"]
        self.best_mean_return = state.get("best_mean_return", float("-inf"))
        self.returns.extend(state["recent_returns"])
        self.lengths.extend(state["recent_lengths"])
