"""The console's progress bar: how far the run is and when it ends, when it has a known end.

A run ends at `--train_for_env_steps` frames or after `--train_for_seconds`, whichever comes first
(or at `--target_mean_return`, which nobody can time). When either limit is set (a preset may set
it) and stdout is a terminal, a tqdm bar stays at the bottom of the console with the ETA, and the
runner's log lines (the console line every `--report_interval` included) scroll above it. Otherwise,
in a pipe, a file or a CI log, there is no bar and the log lines are exactly as without one.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from dataclasses import dataclass
from typing import TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from sf_core.config import Config, default

log = logging.getLogger("sf_core")

RATE_WINDOW_SEC = 10.0  # the frame rate behind the ETA: recent, so start-up and load changes fade out
BAR_STEPS = 1000


@dataclass(frozen=True)
class RunEnd:
    """The limits a run stops at; None where the flag was left at its never-reached default."""

    frames: int | None
    seconds: float | None

    @classmethod
    def from_config(cls, cfg: Config) -> "RunEnd | None":
        frames = cfg.train_for_env_steps if cfg.train_for_env_steps < default("train_for_env_steps") else None
        seconds = cfg.train_for_seconds if cfg.train_for_seconds < default("train_for_seconds") else None
        return cls(frames, seconds) if frames is not None or seconds is not None else None

    def fraction(self, frames: int, elapsed: float) -> float:
        """How much of the run is done, by the limit nearest to being reached."""
        done = [frames / self.frames if self.frames else 0.0, elapsed / self.seconds if self.seconds else 0.0]
        return min(1.0, max(done))

    def eta(self, frames: int, elapsed: float, fps: float) -> float | None:
        """Seconds until the first limit is reached; None while the frame rate is unknown and only the
        frame limit is set."""
        left = []
        if self.frames is not None and fps > 0:
            left.append(max(0.0, (self.frames - frames) / fps))
        if self.seconds is not None:
            left.append(max(0.0, self.seconds - elapsed))
        return min(left) if left else None


class FrameRate:
    """Frames per second over the last RATE_WINDOW_SEC."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()

    def update(self, now: float, frames: int) -> float:
        self.samples.append((now, frames))
        while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW_SEC:
            self.samples.popleft()
        (t0, f0), (t1, f1) = self.samples[0], self.samples[-1]
        return (f1 - f0) / (t1 - t0) if t1 > t0 else 0.0


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """The bar of one training run (`enabled` only on a terminal with a known end); `close` at the end."""

    def __init__(self, cfg: Config, started: float, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stdout
        self.end = RunEnd.from_config(cfg)
        self.started = started
        self.rate = FrameRate()
        self.bar: tqdm | None = None
        self.redirect = None
        if self.end is not None and is_terminal(self.stream):
            # the text after the bar goes in as `desc`: tqdm would put a comma before a postfix
            self.bar = tqdm(total=BAR_STEPS, file=self.stream, dynamic_ncols=True,
                            bar_format="training {percentage:3.0f}%|{bar}| {desc}")
            # log lines go through tqdm.write, above the bar, instead of over it
            self.redirect = logging_redirect_tqdm([log])
            self.redirect.__enter__()

    @property
    def enabled(self) -> bool:
        return self.bar is not None

    def update(self, frames: int, now: float) -> None:
        if self.bar is None or self.end is None:
            return
        elapsed = now - self.started
        fps = self.rate.update(now, frames)
        eta = self.end.eta(frames, elapsed, fps)
        self.bar.n = int(self.end.fraction(frames, elapsed) * BAR_STEPS)
        of = f"/{self.end.frames:,}" if self.end.frames is not None else ""
        eta_text = tqdm.format_interval(eta) if eta is not None else "?"
        self.bar.set_description_str(f"ETA {eta_text} | {frames:,}{of} frames | {fps:,.0f} fps", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.redirect is not None:
            self.redirect.__exit__(None, None, None)
            self.redirect = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None
