"""The console logger every entry point shares (no torch import: the evaluator may not need it)."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("sf_core")


def setup_logging() -> None:
    """`HH:MM:SS LEVEL message` lines on stdout, once per process."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
