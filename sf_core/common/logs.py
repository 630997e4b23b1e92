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


def quiet_signal_slot_logs() -> None:
    """The library logs slot exceptions itself; ours reach the runner with the component's name, so
    those are dropped. Everything else it logs at ERROR (a full queue dropping a signal) stays."""
    logging.getLogger("signal_slot").setLevel(logging.ERROR)
    # a logger's filters see only its own records, not its children's: the module's logger logs them
    logger = logging.getLogger("signal_slot.signal_slot")
    if not any(isinstance(f, _SlotExceptionFilter) for f in logger.filters):
        logger.addFilter(_SlotExceptionFilter())


class _SlotExceptionFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "nhandled exception" not in message
