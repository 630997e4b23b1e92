"""An env pool's background thread (sf_core/service/env_pool.py): what must wait on servers, so that no caller
of the pool does.

Every half recheck interval it
- follows the fleet's changes file, when the pool has one (sf_core/service/elastic.py): slots join and drain;
- checks the failed and the joining slots that are due (each at most every recheck interval): a short `ping`,
  then a `restore` (a fresh instance), and admits those that answer both;
- closes on their servers the slots that left the pool (drained), so that what they held is freed.

It starts with the first thing to do (a failure, a slot added or drained, a changes file to follow).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from sf_core.service.elastic import PoolSource
from sf_core.service.remote_env import RemoteEnv, ServiceError, ServiceTimeout
from sf_core.service.slot import Slot, SlotState

log = logging.getLogger("sf_core")

PING_TIMEOUT_SEC = 0.5  # a health check's first question; a live server answers in microseconds


class CheckedPool(Protocol):
    """What the checker reads and calls of its pool (sf_core/service/env_pool.py's EnvPool)."""

    slots: list[Slot]
    cond: threading.Condition
    closed: threading.Event
    source: PoolSource | None
    to_close: list[tuple[Slot, bool]]
    timeout: float
    recheck_interval: float
    readmitted_total: int
    joined_total: int

    def _connect(self, slot: Slot, timeout: float | None = None) -> RemoteEnv: ...
    def add_slots(self, slots: list[tuple[str, int]]) -> int: ...
    def drain(self, names: list[str]) -> int: ...
    def summary(self) -> str: ...


class SlotChecker:
    def __init__(self, pool: CheckedPool):
        self.pool = pool
        self.thread = threading.Thread(target=self._loop, name="env_pool_checker", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        pool = self.pool
        while not pool.closed.wait(pool.recheck_interval / 2):
            try:
                follow_source(pool)
                check_due_slots(pool)
                close_left_slots(pool, pool.timeout)
            except Exception:  # noqa: BLE001 - a checker that dies would leave failed slots out for good
                log.exception("env pool health check failed")

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)


def follow_source(pool: CheckedPool) -> None:
    """The pool takes the slots its changes file lists for it, when the file changed."""
    wanted = pool.source.poll() if pool.source is not None else None
    if wanted is None:
        return
    names = {f"{address}#{index}" for address, index in wanted}
    drained = pool.drain([s.name for s in pool.slots if s.name not in names])
    added = pool.add_slots(wanted)
    if drained or added:
        log.info("env pool follows %s: %d slot(s) join, %d drain [%s]", pool.source.changes.path, added, drained,
                 pool.summary())


def check_due_slots(pool: CheckedPool) -> int:
    """Check the failed and joining slots that are due; admit those that answer and restore. Returns how many
    failed ones were re-admitted."""
    now = time.monotonic()
    with pool.cond:
        due = [s for s in pool.slots if s.state in (SlotState.ERROR, SlotState.JOINING) and not s.checking
               and now >= s.next_check]
        for s in due:
            s.checking = True
    readmitted, joined, dead_addresses = 0, 0, set()
    for slot in due:
        ok = False
        try:
            if slot.address not in dead_addresses:
                env = pool._connect(slot, PING_TIMEOUT_SEC)
                env.ping(timeout=PING_TIMEOUT_SEC)  # a quick question first: is anybody there?
                env.restore()  # then a fresh instance, which may take the full timeout
                ok = True
        except ServiceError as exc:
            if slot.state is SlotState.JOINING and not slot.last_error:
                log.warning("env slot %s does not join the pool yet: %s", slot.name, exc)
            slot.last_error = str(exc)
            if isinstance(exc, ServiceTimeout):
                dead_addresses.add(slot.address)
        with pool.cond:
            slot.checking = False
            if slot.state not in (SlotState.ERROR, SlotState.JOINING):
                continue  # drained or stopped meanwhile
            if not ok:
                slot.next_check = time.monotonic() + pool.recheck_interval
                continue
            joined += slot.state is SlotState.JOINING
            readmitted += slot.state is SlotState.ERROR
            slot.readmissions += slot.state is SlotState.ERROR
            slot.state, slot.suspect, slot.last_error = SlotState.IDLE, False, ""
            pool.cond.notify_all()
    with pool.cond:
        pool.readmitted_total += readmitted
        pool.joined_total += joined
    if readmitted or joined:
        log.info("%s [%s]", ", ".join(f"{n} env slot(s) {what}" for n, what in (
            (joined, "joined"), (readmitted, "re-admitted: they answer again")) if n), pool.summary())
    return readmitted


def close_left_slots(pool: CheckedPool, timeout: float) -> None:
    """Close on their servers the slots that left the pool (`close` frees their instances), each waited for at
    most `timeout`: a server that is gone or busy only makes its own slot stay open. Then their sockets."""
    with pool.cond:
        slots, pool.to_close = pool.to_close, []
    for slot, close in slots:
        try:
            if close:
                pool._connect(slot, timeout).client.request({"cmd": "close", "slot": slot.index}, timeout=timeout)
        except ServiceError as exc:
            log.info("env slot %s left the pool; closing it on its server failed: %s", slot.name, exc)
        if slot.env is not None:
            slot.env.close()
            slot.env = None
