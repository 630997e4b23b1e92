"""The share of wall time each kind of component spent working over a window: the console's `busy:` hint and
TensorBoard's `perf/*_busy` each take their own windows.

Components report work in lumps: a rollout worker every 0.25 s, a learner once per dataset (seconds of SGD at
once), so a window shorter than a second measures when reports arrived rather than how busy anything was (the
last TensorBoard point, written at close a moment after the one before, read 0.0 or 1.68). A window that is
too short, or in which no component reported, gives no shares and carries on into the next; a report may
also count work done before its window began, so a share is at most 1.0.
"""

from __future__ import annotations

MIN_TENSORBOARD_WINDOW_SEC = 1.0


class BusyShares:
    def __init__(self, counts: dict[str, int], seconds: dict[str, float], now: float):
        self.counts = counts  # how many components share each kind of work
        self.snapshot = (now, dict(seconds))

    def take(self, seconds: dict[str, float], copies: dict[str, int], now: float,
             min_window: float = 0.0) -> dict[str, float]:
        """Each kind's share of the window since the last shares given (busy seconds over wall seconds times
        its components, times `copies` of them: a cluster's samplers); empty while the window is shorter than
        `min_window` or holds no report."""
        then, before = self.snapshot
        wall = now - then
        spent = {kind: seconds[kind] - before[kind] for kind in seconds}
        if wall < max(min_window, 1e-6) or not any(spent.values()):
            return {}
        self.snapshot = (now, dict(seconds))
        return {kind: min(1.0, spent[kind] / (wall * self.counts[kind] * copies[kind])) for kind in spent}
