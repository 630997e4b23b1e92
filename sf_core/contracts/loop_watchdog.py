"""The runner's loop watchdog: a thread that keeps the runner's own loop from waiting forever.

A component killed while it held the lock of the runner's signal queue (inside a put: every component reports
to the runner) would leave the runner's loop waiting for that lock inside faster-fifo for good. Once the loop
has not turned for LOCK_CHECK_SEC, the thread looks at the lock: held by a thread that is gone, it is given
back (sf_core/contracts/queue_lock.py), the loop goes on and the runner handles that death as any other. A
component stopped inside such a put (SIGSTOP, a debugger) holds the lock alive, and the loop cannot run the check
that kills hung components: once it has held the lock for `hung_after` seconds (--heartbeat_timeout), the thread
has the runner kill that process as a hung one, and gives its lock back at the next look. If the loop still does
not turn within `limit` seconds, for whatever reason, the thread names the problem and where the loop waits,
kills the component processes and exits, instead of hanging.
"""

from __future__ import annotations

import logging
import os
import signal as os_signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

from sf_core.contracts.queue_lock import QueueLock, process_of

log = logging.getLogger("sf_core")

LOCK_CHECK_SEC = 2.0


def start_loop_watchdog(last_turn: Callable[[], float], limit: float, processes: Callable[[], list],
                        done: threading.Event, exit_code: int, own_queue: Any = None,
                        hung_after: float = float("inf"), kill_hung: Callable[[int], object] | None = None) -> None:
    """`last_turn()`: when the loop last turned (time.time()); `own_queue`: the runner's signal queue;
    `kill_hung(pid)`: the runner's kill of that process's components, if hung."""
    lock = QueueLock.of(own_queue) if own_queue is not None else None
    loop_thread = threading.get_ident()

    def watch() -> None:
        held: tuple[int, float] = (0, 0.0)  # the lock's live holder, and since when it was seen holding it
        while not done.wait(1.0):
            now = time.time()
            stalled = now - last_turn()
            if lock is None or stalled <= LOCK_CHECK_SEC:
                held = (0, 0.0)  # the loop turns: a later stall counts its holder's time afresh
            else:
                owner = lock.release_if_owner_died()
                if owner:
                    log.warning("a dead process (thread %d) left the runner's signal queue locked: given back after "
                                "%.0fs", owner, stalled)
                holder = lock.owner()
                held = (holder, held[1] if holder == held[0] else now)
                if holder and now - held[1] > hung_after and kill_hung is not None:
                    kill_hung(process_of(holder))
            if stalled > limit:
                log.error("the runner's event loop has not run for %.0fs: killing all components; it waits in:\n%s",
                          limit, where(loop_thread))
                for proc in processes():
                    if proc.pid is not None and proc.is_alive():
                        os.kill(proc.pid, os_signal.SIGKILL)
                os._exit(exit_code)

    threading.Thread(target=watch, name="runner_loop_watchdog", daemon=True).start()


def where(thread: int) -> str:
    """The innermost frames of a thread's stack, for the error that ends a stuck loop."""
    frame = sys._current_frames().get(thread)
    return "".join(traceback.format_stack(frame, limit=-4)).rstrip() if frame is not None else "(thread gone)"
