"""The env's episode metrics (`episode_extra_stats`, `is_success`; the rule is in sf_core/sampling/episode_metrics.py),
averaged over the last --stats_window episodes that reported each: for TensorBoard and W&B (`episode/<key>`, and
`policy_K/episode/<key>` for each of several policies), training_summary.json (`episode_metrics`) and the console."""

from __future__ import annotations

import logging
from collections import deque

import numpy as np

from sf_core.contracts.signals import Metric
from sf_core.sampling.episode_metrics import SUCCESS_RATE

log = logging.getLogger("sf_core")

Windows = dict[str, deque[float]]


class EpisodeMetrics:
    def __init__(self, window: int, num_policies: int):
        self.window = window
        self.overall: Windows = {}
        self.policies: list[Windows] = [{} for _ in range(num_policies)]
        self.warned: set[str] = set()

    def add(self, metrics: list[Metric], skipped: dict[str, str]) -> None:
        for policy, key, value in metrics:
            self._window(self.overall, key).append(value)
            self._window(self.policies[policy], key).append(value)
        for key, why in skipped.items():
            if key not in self.warned:  # each rollout worker says it once; the run once in all
                self.warned.add(key)
                log.warning("episode metric %r from the env's info is skipped: %s (logged once per key)", key, why)

    def _window(self, windows: Windows, key: str) -> deque[float]:
        found = windows.get(key)
        if found is None:
            found = windows[key] = deque(maxlen=self.window)
        return found

    def means(self, policy: int | None = None) -> dict[str, float]:
        """Each key's mean over its window: the run's, or one policy's."""
        windows = self.overall if policy is None else self.policies[policy]
        return {key: float(np.mean(values)) for key, values in sorted(windows.items()) if values}

    def mean(self, key: str, policy: int | None = None) -> float | None:
        values = (self.overall if policy is None else self.policies[policy]).get(key)
        return float(np.mean(values)) if values else None

    def forget(self, policy: int) -> None:
        """PBT replaced the policy's weights: its recent episodes were the old weights'."""
        self.policies[policy].clear()

    # ---- persistence across a resume (in the checkpoints' runner state, like the recent returns)
    def state(self, policy: int | None = None) -> dict[str, list[float]]:
        windows = self.overall if policy is None else self.policies[policy]
        return {key: [float(v) for v in values] for key, values in windows.items()}

    def restore(self, state: dict[str, list[float]], policy: int | None = None) -> None:
        windows = self.overall if policy is None else self.policies[policy]
        for key, values in state.items():
            self._window(windows, key).extend(values)

    # ---- output
    def write(self, w, step: int) -> None:
        for key, mean in self.means().items():
            w.add_scalar(f"episode/{key}", mean, step)
        if len(self.policies) > 1:
            for k in range(len(self.policies)):
                for key, mean in self.means(k).items():
                    w.add_scalar(f"policy_{k}/episode/{key}", mean, step)

    def console(self) -> str:
        rate = self.mean(SUCCESS_RATE)
        return "" if rate is None else f" | success {rate:.0%}"
