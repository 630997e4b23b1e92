"""The runner's loop watchdog: a thread that keeps the runner's own loop from waiting forever.

A component killed while it held the lock of the runner's signal queue (inside a put: every component reports
to the runner) would leave the runner's loop waiting for that lock inside faster-fifo for good. Once the loop
has not turned for LOCK_CHECK_SEC, the thread looks at the lock: held by a thread that is gone, it is given
back (sf_core/contracts/queue_lock.py), the loop goes on and the runner handles that death as any other. If the
loop still does not turn within `limit` seconds, for whatever reason, the thread names the problem, kills the
component processes and exits, instead of hanging.
"""

from __future__ import annotations

import logging
import os
import signal as os_signal
import threading
import time
from typing import Any, Callable

from sf_core.contracts.queue_lock import QueueLock

log = logging.getLogger("sf_core")

LOCK_CHECK_SEC = 2.0


def start_loop_watchdog(last_turn: Callable[[], float], limit: float, processes: Callable[[], list],
                        done: threading.Event, exit_code: int, own_queue: Any = None) -> None:
    """`last_turn()`: when the loop last turned (time.time()); `own_queue`: the runner's signal queue."""
    lock = QueueLock.of(own_queue) if own_queue is not None else None

    def watch() -> None:
        while not done.wait(1.0):
            stalled = time.time() - last_turn()
            if lock is not None and stalled > LOCK_CHECK_SEC:
                owner = lock.release_if_owner_died()
                if owner:
                    log.warning("a dead process (thread %d) left the runner's signal queue locked: given back after "
                                "%.0fs", owner, stalled)
            if stalled > limit:
                log.error("the runner's event loop has not run for %.0fs: killing all components", limit)
                for proc in processes():
                    if proc.pid is not None and proc.is_alive():
                        os.kill(proc.pid, os_signal.SIGKILL)
                os._exit(exit_code)

    threading.Thread(target=watch, name="runner_loop_watchdog", daemon=True).start()
