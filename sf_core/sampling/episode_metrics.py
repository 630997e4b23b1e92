"""What an env reports about an episode besides its return and length: the one rule, read where episodes end.

On the step that ends an episode (of a multi-agent env: an agent's episode, from that agent's info), the info
dict may hold

- `episode_extra_stats`: a dict of scalars (Sample Factory's convention), each recorded under its own key;
- `is_success`: a success flag (Stable-Baselines3's and gymnasium-robotics' convention), recorded as
  `success_rate` (a bool counts 1.0 or 0.0), so its mean over episodes is the success rate.

A value must be a finite real scalar (a Python or numpy bool, int or float, or a 0-d array); any other is
skipped, with a reason the runner logs once per key. So is a key that would write over a built-in episode
scalar (`return`, `length`, `count`, `return_agent_*`). Episodes the env itself does not count (Atari's lost
lives: `info["episode_return"] is None`) record nothing. The runner averages each key over the last
--stats_window episodes that reported it (sf_core/run/episode_metrics.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

EXTRA_STATS = "episode_extra_stats"
SUCCESS_FLAG = "is_success"
SUCCESS_RATE = "success_rate"
BUILT_IN = ("return", "length", "count")  # episode/<key> scalars the runner writes itself


def scalar(value: Any) -> float | str:
    """`value` as a float, or why it is not a finite real scalar."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if not isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)):
        shape = f" of shape {value.shape}" if isinstance(value, np.ndarray) else ""
        return f"not a real scalar ({type(value).__name__}{shape})"
    number = float(value)
    return number if math.isfinite(number) else f"not finite ({number})"


def episode_metrics(info: dict) -> list[tuple[str, float | str]]:
    """(key, value or why it was skipped) for each metric in the info of an episode's last step."""
    found: list[tuple[str, float | str]] = []
    extra = info.get(EXTRA_STATS)
    if isinstance(extra, dict):
        found += [(str(key), _built_in(str(key)) or scalar(value)) for key, value in extra.items()]
    elif extra is not None:
        found.append((EXTRA_STATS, f"not a dict ({type(extra).__name__})"))
    if SUCCESS_FLAG in info:
        found.append((SUCCESS_RATE, scalar(info[SUCCESS_FLAG])))
    return found


def _built_in(key: str) -> str:
    if key in BUILT_IN or key.startswith("return_agent_"):
        return f"the name of a built-in scalar (episode/{key}): rename it"
    return ""
