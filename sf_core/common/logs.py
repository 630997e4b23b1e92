"""The console logger every entry point shares (no torch import: the evaluator may not need it)."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("sf_core")


class _CurrentStdout(logging.StreamHandler):
    """Writes to sys.stdout as it is at each line, not as it was at set-up: a caller that swaps stdout (a
    notebook, a test's capture) and later closes its stream would otherwise leave the logger writing to a
    closed file."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _value) -> None:
        pass


def setup_logging() -> None:
    """`HH:MM:SS LEVEL message` lines on stdout, once per process."""
    if not log.handlers:
        handler = _CurrentStdout()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
