"""A signal queue read by polling, for a process that takes over the queue of one that died."""

from __future__ import annotations

import time
from queue import Empty
from typing import Any


class PollingQueue:
    """A faster-fifo queue whose reader never waits on its condition variable: it polls, napping between tries.

    A process killed while waiting on a queue (an idle loop's usual state) stays counted among that condition
    variable's waiters for good (process-shared glibc condition variables are not robust). Once another process
    waits on it too, a put's signal waits for the dead waiter to leave: the putter blocks forever, holding the
    queue's lock. With no live waiter, a signal returns at once. So the process that takes over such a queue
    polls it; a message then waits at most a nap (MAX_NAP_SEC once the queue has been idle a while)."""

    MIN_NAP_SEC, MAX_NAP_SEC = 5e-5, 2e-3

    def __init__(self, queue: Any):
        self.queue, self.nap = queue, self.MIN_NAP_SEC

    def get_many(self, block: bool = True, timeout: float | None = None, **kwargs: Any) -> list:
        deadline = time.monotonic() + (timeout if block and timeout is not None else 0.0 if not block else 1e9)
        while True:
            try:
                found = self.queue.get_many(block=False, **kwargs)
                self.nap = self.MIN_NAP_SEC
                return found
            except Empty:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(self.nap, left))
                self.nap = min(2 * self.nap, self.MAX_NAP_SEC)

    def put_many(self, *args: Any, **kwargs: Any) -> None:
        self.queue.put_many(*args, **kwargs)
