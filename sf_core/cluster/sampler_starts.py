"""Sampler starts: where and when the ingest (sf_core/cluster/ingest.py) starts a sampler, and when a started
one counts as live.

A sampler is live once its actor answers (its constructor has built the node's pipeline), not when the
actor is created: Ray queues calls to an actor it has not placed, as long as it takes. A lost sampler's
replacement goes into its own placement-group bundle if that bundle is placed and free (its process died
on a node that lives on, or its node died and Ray placed the bundle again on a node that joined since),
else on any node with room (SPREAD); with room nowhere, it waits, without an actor, and the room is looked
for again every ROOM_CHECK_SEC until a node has it: training goes on with the other samplers meanwhile.
Waiting costs no --max_sampler_restarts: a loss costs one, however long its replacement waits.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

ROOM_CHECK_SEC = 1.0  # how often a waiting replacement looks for room (two GCS calls of about a millisecond)
# A sampler that has not answered this long after its actor was created is given up as lost: its node may
# be unable to start it (Ray queues an actor for ever), or its constructor hangs. Building a node's pipeline
# takes seconds (tens on a busy machine).
START_TIMEOUT_SEC = 120.0
# A replacement is said to wait (the console, the summary's events) once it has found no room for this long:
# Ray's view of free resources lags by up to a second, so a bundle just freed by a dead process looks taken
WAIT_REPORT_SEC = 3.0
WAIT_LOG_SEC = 30.0  # how often the console repeats that a replacement still waits


@dataclass(eq=False)  # one per start: compared by identity
class Start:
    index: int
    incarnation: int
    wanted_at: float = field(default_factory=time.monotonic)
    handle: Any = None  # the actor, once created; None while it waits for room
    created_at: float = 0.0
    versions: list[int] = field(default_factory=list)  # each policy's weights version it was created with
    waiting_since: float | None = None  # when it first found no room
    reported: bool = False  # said to wait (once it has for WAIT_REPORT_SEC)
    logged_at: float = 0.0


class SamplerStarts:
    """Starts wanted, waiting for room or under way; their answers are queued by Ray's threads for the
    ingest's loop, which `wake` wakes."""

    def __init__(self, launch: Callable[[Start, Any], None], room: Callable[[list[int]], list[Any]],
                 wake: Callable[[], None]):
        """`launch(start, strategy)` creates the start's actor with that scheduling strategy; `room(bundles)`
        says where each of those bundles' samplers could start now (a strategy, or None: nowhere)."""
        self.launch, self.room, self.wake = launch, room, wake
        self.waiting: list[Start] = []
        self.under_way: list[Start] = []
        self.answered: deque[tuple[Start, Future]] = deque()
        self.checked_at = 0.0

    def __len__(self) -> int:
        return len(self.waiting) + len(self.under_way)

    def begin(self, start: Start, strategy: Any) -> None:
        """Create the actor now, with `strategy`, and watch for its first answer."""
        self.launch(start, strategy)
        start.created_at = time.monotonic()
        self.under_way.append(start)
        start.handle.node_id.remote().future().add_done_callback(lambda answer: self._answered(start, answer))

    def _answered(self, start: Start, answer: Future) -> None:
        """On a thread of Ray's: queue it and wake the loop (deque.append is atomic)."""
        self.answered.append((start, answer))
        self.wake()

    def want(self, start: Start) -> None:
        self.waiting.append(start)
        self.checked_at = 0.0  # look for room at the next chance, not a second later

    def place(self, now: float) -> tuple[list[tuple[Start, Any]], list[Start]]:
        """Begin each waiting start that has room now (at most every ROOM_CHECK_SEC); returns those begun, with
        their strategies, and those that have now found no room for WAIT_REPORT_SEC."""
        if not self.waiting or now - self.checked_at < ROOM_CHECK_SEC:
            return [], []
        self.checked_at = now
        strategies = self.room([start.index for start in self.waiting])
        begun, newly_waiting, still = [], [], []
        for start, strategy in zip(self.waiting, strategies):
            if strategy is not None:
                self.begin(start, strategy)
                begun.append((start, strategy))
                continue
            if start.waiting_since is None:
                start.waiting_since = now
            if not start.reported and now - start.waiting_since >= WAIT_REPORT_SEC:
                start.reported = True
                newly_waiting.append(start)
            still.append(start)
        self.waiting = still
        return begun, newly_waiting

    def take_answers(self) -> list[tuple[Start, Future]]:
        """Answers of starts still under way (a start given up already is left out)."""
        taken = []
        while self.answered:
            start, answer = self.answered.popleft()
            if start in self.under_way:
                self.under_way.remove(start)
                taken.append((start, answer))
        return taken

    def overdue(self, now: float) -> list[Start]:
        """Starts under way past START_TIMEOUT_SEC, no longer under way (the caller ends their actors)."""
        late = [start for start in self.under_way if now - start.created_at > START_TIMEOUT_SEC]
        self.under_way = [start for start in self.under_way if start not in late]
        return late

    def still_waiting(self, now: float) -> list[Start]:
        """Waiting starts not mentioned for WAIT_LOG_SEC (each is mentioned again)."""
        due = [s for s in self.waiting if s.reported and now - max(s.logged_at, s.waiting_since or now)
               >= WAIT_LOG_SEC]
        for start in due:
            start.logged_at = now
        return due

    def handles(self) -> list:
        return [start.handle for start in self.under_way]
