"""A pool of env-service slots with a lifecycle (`PooledEnv`, sf_core/service/pooled_env.py, draws from it).

Every slot is in one state:

    joining ──check answers──> idle ──acquire──> busy ──release (restored to its initial snapshot)──> idle
                                                   │
                                                   └──failure (no answer, bad answer, env raised)──> error
    error ──health check answers──> idle
    drain: idle, error, joining -> gone at once; busy -> draining ──release──> gone (its server slot closed)
    close: every slot -> stopped

`acquire(timeout)` never blocks longer than its timeout; of the idle slots it hands out the one the pool's
`choice` picks (least-loaded by default: sf_core/service/slot_choice.py). From the first failure on, a
background thread health-checks failed slots (each at most every `recheck_interval` seconds: a short `ping`, then a
`restore`) and re-admits those whose server answers again, so no caller waits on a dead server for it.
A slot that times out on a server that does not answer a quick ping either takes that server's other
slots down with it: idle ones go to error at once, and the holders of busy ones fail at their next call
instead of waiting out the same timeout again. (If the server still answers, only that instance is
stuck: a server with --parallel=True keeps answering while one of its instances hangs.) The pool is thread-safe: the
evaluator's task threads share one.

Elastic pools (`add_slots`, `drain`, or `follow` a fleet's changes file, sf_core/service/elastic.py): a slot
added joins once it answers the same check (a ping, then a restore: a fresh instance) and serves the same env
with the same spaces. A drained slot is never handed out again; a busy one finishes the work its holder does
(a rollout, a task) and leaves when given back. A slot that leaves is closed on its server (`close`: its
instance freed) by the background thread, so no caller waits on it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import gymnasium as gym

from sf_core.service.elastic import PoolSource
from sf_core.service.protocol import space_from_json
from sf_core.service.slot import PoolTimeout, Slot, SlotLost, SlotState
from sf_core.service.slot_checker import PING_TIMEOUT_SEC, SlotChecker, check_due_slots, close_left_slots
from sf_core.service.slot_choice import LeastLoaded, SlotChoice
from sf_core.service.remote_env import EnvClient, RemoteEnv, ServiceError, ServiceTimeout

__all__ = ["EnvPool", "PoolTimeout", "Slot", "SlotLost", "SlotState", "server_answers"]

log = logging.getLogger("sf_core")


class EnvPool:
    def __init__(self, slots: list[tuple[str, int]], env_name: str | None = None, timeout: float = 5.0,
                 recheck_interval: float = 1.0, choice: SlotChoice | None = None):
        if not slots:
            raise ValueError("an env pool needs at least one slot")
        # replaced, never changed in place, so that a reader without the lock sees one whole list
        self.slots = [Slot(address, index) for address, index in slots]
        self.choice = choice or LeastLoaded()  # which idle slot goes out next
        self.env_name, self.timeout, self.recheck_interval = env_name, timeout, recheck_interval
        self.description: dict | None = None  # the first server's hello: every slot must match it
        self.cond = threading.Condition()
        self.readmitted_total = self.failed_total = self.joined_total = self.drained_total = 0
        self.source: PoolSource | None = None  # the fleet's changes this pool follows (elastic pools)
        self.to_close: list[tuple[Slot, bool]] = []  # slots that left: their sockets to close, and whether the
        # server's instance too (not a failed one's: its server may be gone)
        # failed, added and drained slots are dealt with on a background thread, started at the first of them,
        # so that the caller's loop (a rollout worker's, with live envs on other slots) never waits on a server
        self.checker: SlotChecker | None = None
        self.closed = threading.Event()
        self.on_close: Callable[[], None] | None = None  # what else ends with the pool (an in-process server)

    # ---------------------------------------------------------------- spaces
    def describe(self, timeout: float | None = None) -> dict:
        """The served env's description (name, spaces), from the first slot that answers."""
        if self.description is not None:
            return self.description
        errors, silent = [], set()
        for slot in self.slots:
            if slot.address in silent:
                continue
            try:
                self._connect(slot, timeout)
                return self.description
            except ServiceError as exc:
                errors.append(str(exc))
                if isinstance(exc, ServiceTimeout):
                    silent.add(slot.address)
        raise ServiceError("no env server answered: " + "; ".join(dict.fromkeys(errors)))

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        d = self.describe()
        return space_from_json(d["observation_space"]), space_from_json(d["action_space"])

    def _connect(self, slot: Slot, timeout: float | None = None) -> RemoteEnv:
        if slot.env is None:
            env = RemoteEnv(slot.address, slot.index, self.timeout if timeout is None else timeout)
            env.client.timeout = self.timeout
            d = env.description
            if self.env_name is not None and d["env"] != self.env_name:
                env.close()
                raise ServiceError(f"{slot.address} serves {d['env']!r}, not {self.env_name!r}")
            if self.description is None:
                self.description = d
            elif (d["observation_space"], d["action_space"]) != (self.description["observation_space"],
                                                                 self.description["action_space"]):
                env.close()
                raise ServiceError(f"{slot.address} serves {d['env']!r} with other spaces than the other servers")
            slot.env = env
        return slot.env

    # ---------------------------------------------------------------- lifecycle
    def acquire(self, timeout: float, avoid: frozenset[str] = frozenset()) -> Slot:
        """A healthy slot, now busy; PoolTimeout if none within `timeout` seconds. Slots named in `avoid`
        (where this work failed before) are taken only if no other slot of the pool can serve."""
        deadline = time.monotonic() + timeout
        while True:
            with self.cond:
                slot = self._take_idle(avoid)
                if slot is not None:
                    return slot
            if self.checker is None:
                self.health_check()
            with self.cond:
                slot = self._take_idle(avoid)
                if slot is not None:
                    return slot
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PoolTimeout(f"no healthy env slot within {timeout:g}s ({self.summary()})")
                self.cond.wait(min(remaining, self.recheck_interval / 2))

    def _take_idle(self, avoid: frozenset[str] = frozenset()) -> Slot | None:
        idle = [s for s in self.slots if s.state is SlotState.IDLE]
        preferred = [s for s in idle if s.name not in avoid]
        if not preferred and any(s.state is SlotState.BUSY and s.name not in avoid for s in self.slots):
            return None  # a slot not tried yet will come free: wait for it
        if not idle:
            return None
        slot = self.choice.pick(preferred or idle, self.slots)
        slot.state = SlotState.BUSY
        slot.uses += 1
        return slot

    def try_acquire(self, avoid: frozenset[str] = frozenset()) -> Slot | None:
        """`acquire` without waiting: a healthy slot, now busy, or None. For a caller that does its own
        waiting (the evaluator's slot broker, which takes a task's slots of several pools all-or-none)."""
        with self.cond:
            return self._take_idle(avoid)

    def untake(self, slot: Slot) -> None:
        """Undo a `try_acquire` whose slot was never used (nothing to restore, and no use to count)."""
        with self.cond:
            if slot.state in (SlotState.BUSY, SlotState.DRAINING):
                slot.uses -= 1
                self._give_back(slot)

    def release(self, slot: Slot, restore: bool = True) -> None:
        """Give a busy slot back; with `restore`, reset its instance to its initial snapshot first. A draining
        slot leaves the pool instead (nothing to restore: it is closed)."""
        if slot.state not in (SlotState.BUSY, SlotState.DRAINING):
            return
        if restore and slot.state is SlotState.BUSY:
            try:
                self._connect(slot).restore()
            except ServiceError as exc:
                self.mark_failed(slot, exc)
                return
        with self.cond:  # drained meanwhile (during the restore) or not: decided under the lock
            self._give_back(slot)

    def _give_back(self, slot: Slot) -> None:
        if slot.state is SlotState.DRAINING:
            self._leave(slot, close=True)
        elif slot.state is SlotState.BUSY:
            slot.state = SlotState.IDLE
        self.cond.notify_all()

    def mark_failed(self, slot: Slot, error: Exception | str, server_down: bool | None = None) -> None:
        """Take a slot out of service until a health check re-admits it. `server_down`: already known by
        the caller (the evaluator's runner asked the server); None: found out here. A draining slot that
        fails leaves the pool at once."""
        # a timeout on one slot: is the whole server gone, or only this instance stuck (--parallel)?
        if server_down is None:
            server_down = isinstance(error, ServiceTimeout) and not self._answers(slot.address)
        now = time.monotonic()
        with self.cond:
            if slot.state is SlotState.STOPPED:
                return
            slot.failures += 1
            self.failed_total += 1
            if slot.state is SlotState.DRAINING:
                self._leave(slot, close=False)
            else:
                slot.state, slot.last_error, slot.next_check = SlotState.ERROR, str(error), now + self.recheck_interval
            if server_down:  # its idle slots are out too, and the holders of busy ones fail at their next call
                for other in self.slots:
                    if other.address == slot.address and other.state is SlotState.IDLE:
                        other.state, other.last_error, other.next_check = SlotState.ERROR, str(error), now
                    elif other.address == slot.address and other.state in (SlotState.BUSY, SlotState.DRAINING):
                        other.suspect = True
            self.cond.notify_all()
        self._start_checker()
        log.warning("env slot %s failed (%s); out of service until it answers again [%s]", slot.name, error,
                    self.summary())

    @staticmethod
    def _answers(address: str) -> bool:
        client = EnvClient(address, PING_TIMEOUT_SEC)
        try:
            client.request({"cmd": "ping"})
            return True
        except ServiceError:
            return False
        finally:
            client.close()

    # ---------------------------------------------------------------- elastic
    def add_slots(self, slots: list[tuple[str, int]]) -> int:
        """Slots (address, index) join the pool once they pass a health check on the background thread; a
        draining one listed here stays. Returns how many are new."""
        with self.cond:
            known = {s.name: s for s in self.slots}
            new = []
            for address, index in slots:
                slot = known.get(f"{address}#{index}")
                if slot is None:
                    new.append(Slot(address, index, SlotState.JOINING))
                elif slot.state is SlotState.DRAINING:
                    slot.state = SlotState.BUSY  # the drain is called off: its holder keeps it
            names = {s.name for s in new}
            self.to_close = [(s, c) for s, c in self.to_close if s.name not in names]  # back before it was closed
            self.slots = self.slots + new
        if new:
            self._start_checker()
        return len(new)

    def drain(self, names: list[str]) -> int:
        """Slots leave the pool, named `host:port#index`, or `host:port` for all of a server's: an idle, failed
        or joining one at once, a busy one when its holder gives it back (`release`). Returns how many."""
        targets = set(names)
        with self.cond:
            chosen = [s for s in self.slots if (s.name in targets or s.address in targets)
                      and s.state not in (SlotState.DRAINING, SlotState.STOPPED)]
            for slot in chosen:
                if slot.state is SlotState.BUSY:
                    slot.state = SlotState.DRAINING
                else:
                    self._leave(slot, close=slot.state is SlotState.IDLE)
            self.cond.notify_all()
        if chosen:
            self._start_checker()
        return len(chosen)

    def follow(self, source: PoolSource) -> None:
        """Keep this pool's slots as `source` (a fleet's changes file) lists them, from now on."""
        self.source = source
        self._start_checker()

    def _leave(self, slot: Slot, close: bool) -> None:
        """(Under the lock.) The slot is out of the pool; `close`: its instance is closed on its server."""
        self.slots = [s for s in self.slots if s is not slot]
        slot.state = SlotState.STOPPED
        self.drained_total += 1
        self.to_close.append((slot, close))

    # ---------------------------------------------------------------- the background thread
    def _start_checker(self) -> None:
        with self.cond:
            if self.checker is None and not self.closed.is_set():
                self.checker = SlotChecker(self)

    def health_check(self) -> int:
        """Check the failed and joining slots that are due; admit those that answer and restore. Returns how
        many failed ones were re-admitted (sf_core/service/slot_checker.py)."""
        return check_due_slots(self)

    def counts(self) -> dict[str, int]:
        with self.cond:
            return {state.value: sum(s.state is state for s in self.slots) for state in SlotState}

    def waits_on_servers(self) -> bool:
        """Whether an env without a slot here waits for servers to come back: a slot is failed, or none is left
        (all drained). Otherwise it waits for busy slots, or for slots to be added."""
        slots = self.slots
        return not slots or any(s.state is SlotState.ERROR for s in slots)

    def summary(self) -> str:
        c = {state.value: sum(s.state is state for s in self.slots) for state in SlotState}
        return ", ".join(f"{n} {state}" for state, n in c.items() if n) or "no slots"

    def close(self) -> None:
        self.closed.set()
        with self.cond:
            slots = self.slots
            for slot in slots:
                slot.state = SlotState.STOPPED
            self.cond.notify_all()
        if self.checker is not None:
            self.checker.join(timeout=self.timeout + 2 * PING_TIMEOUT_SEC)  # it may be inside a check
        close_left_slots(self, PING_TIMEOUT_SEC)  # slots drained since its last round are closed all the same
        for slot in slots:
            if slot.env is not None:
                slot.env.close()
                slot.env = None
        if self.on_close is not None:
            self.on_close()


def server_answers(address: str) -> bool:
    """Whether the server at `address` answers a quick ping: after a timeout, tells a dead server from a
    stuck instance (the evaluator's runners ask, and tell the slot broker)."""
    return EnvPool._answers(address)
