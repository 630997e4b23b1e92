"""A pool of env-service slots with a lifecycle, and the gymnasium.Env that draws from it.

Every slot is in one state:

    idle ──acquire──> busy ──release (restored to its initial snapshot)──> idle
                       │
                       └──failure (no answer, bad answer, env raised)──> error ──health check answers──> idle
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
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

import gymnasium as gym

from sf_core.service.protocol import space_from_json
from sf_core.service.slot_choice import LeastLoaded, SlotChoice
from sf_core.service.remote_env import (
    EnvClient,
    RemoteEnv,
    ServiceError,
    ServiceTimeout,
)

log = logging.getLogger("sf_core")

PING_TIMEOUT_SEC = 0.5  # a health check's first question; a live server answers in microseconds


class SlotState(str, Enum):
    IDLE = "idle"
    BUSY = "busy"
    ERROR = "error"
    STOPPED = "stopped"


class PoolTimeout(ServiceError):
    """No healthy slot became free within the acquire timeout."""


class SlotLost(ServiceError):
    """The slot an env was running on failed: the episode in progress is gone."""


@dataclass(eq=False)
class Slot:
    address: str  # host:port
    index: int  # instance index on that server
    state: SlotState = SlotState.IDLE
    env: RemoteEnv | None = None  # the connection, opened on first use
    failures: int = 0
    readmissions: int = 0
    last_error: str = ""
    next_check: float = 0.0
    checking: bool = False
    suspect: bool = False  # its server timed out on another slot: fail fast instead of waiting again
    uses: int = field(default=0)
    in_flight: int = 0  # requests sent to it and not yet answered (sf_core/service/slot_choice.py)

    @property
    def name(self) -> str:
        return f"{self.address}#{self.index}"


class EnvPool:
    def __init__(self, slots: list[tuple[str, int]], env_name: str | None = None, timeout: float = 5.0,
                 recheck_interval: float = 1.0, choice: SlotChoice | None = None):
        if not slots:
            raise ValueError("an env pool needs at least one slot")
        self.slots = [Slot(address, index) for address, index in slots]
        self.choice = choice or LeastLoaded()  # which idle slot goes out next
        self.env_name, self.timeout, self.recheck_interval = env_name, timeout, recheck_interval
        self.description: dict | None = None  # the first server's hello: every slot must match it
        self.cond = threading.Condition()
        self.readmitted_total = 0
        self.failed_total = 0
        # failed slots are checked on a background thread, started at the first failure, so that the
        # caller's loop (a rollout worker's, with live envs on other slots) never waits on a dead server
        self.checker: threading.Thread | None = None
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
            if slot.state is SlotState.BUSY:
                slot.state = SlotState.IDLE
                slot.uses -= 1
                self.cond.notify_all()

    def release(self, slot: Slot, restore: bool = True) -> None:
        """Give a busy slot back; with `restore`, reset its instance to its initial snapshot first."""
        if slot.state is not SlotState.BUSY:
            return
        if restore:
            try:
                self._connect(slot).restore()
            except ServiceError as exc:
                self.mark_failed(slot, exc)
                return
        with self.cond:
            slot.state = SlotState.IDLE
            self.cond.notify_all()

    def mark_failed(self, slot: Slot, error: Exception | str, server_down: bool | None = None) -> None:
        """Take a slot out of service until a health check re-admits it. `server_down`: already known by
        the caller (the evaluator's runner asked the server); None: found out here."""
        # a timeout on one slot: is the whole server gone, or only this instance stuck (--parallel)?
        if server_down is None:
            server_down = isinstance(error, ServiceTimeout) and not self._answers(slot.address)
        now = time.monotonic()
        with self.cond:
            if slot.state is SlotState.STOPPED:
                return
            slot.state, slot.last_error, slot.next_check = SlotState.ERROR, str(error), now + self.recheck_interval
            slot.failures += 1
            self.failed_total += 1
            if server_down:  # its idle slots are out too, and the holders of busy ones fail at their next call
                for other in self.slots:
                    if other.address == slot.address and other.state is SlotState.IDLE:
                        other.state, other.last_error, other.next_check = SlotState.ERROR, str(error), now
                    elif other.address == slot.address and other.state is SlotState.BUSY:
                        other.suspect = True
            self.cond.notify_all()
            if self.checker is None:
                self.checker = threading.Thread(target=self._check_failed_slots, name="env_pool_checker", daemon=True)
                self.checker.start()
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

    def _check_failed_slots(self) -> None:
        while not self.closed.wait(self.recheck_interval / 2):
            try:
                self.health_check()
            except Exception:  # noqa: BLE001 - a checker that dies would leave failed slots out for good
                log.exception("env pool health check failed")

    def health_check(self) -> int:
        """Check the failed slots that are due; re-admit those that answer and restore. Returns how many."""
        now = time.monotonic()
        with self.cond:
            due = [s for s in self.slots if s.state is SlotState.ERROR and not s.checking and now >= s.next_check]
            for s in due:
                s.checking = True
        readmitted, dead_addresses = 0, set()
        for slot in due:
            ok = False
            try:
                if slot.address not in dead_addresses:
                    env = self._connect(slot, PING_TIMEOUT_SEC)
                    env.ping(timeout=PING_TIMEOUT_SEC)  # a quick question first: is anybody there?
                    env.restore()  # then a fresh instance, which may take the full timeout
                    ok = True
            except ServiceError as exc:
                slot.last_error = str(exc)
                if isinstance(exc, ServiceTimeout):
                    dead_addresses.add(slot.address)
            with self.cond:
                slot.checking = False
                if slot.state is not SlotState.ERROR:
                    continue  # stopped meanwhile
                if ok:
                    slot.state, slot.suspect = SlotState.IDLE, False
                    slot.readmissions += 1
                    self.readmitted_total += 1
                    readmitted += 1
                    self.cond.notify_all()
                else:
                    slot.next_check = time.monotonic() + self.recheck_interval
        if readmitted:
            log.info("re-admitted %d env slot(s) that answer again [%s]", readmitted, self.summary())
        return readmitted

    def counts(self) -> dict[str, int]:
        with self.cond:
            return {state.value: sum(s.state is state for s in self.slots) for state in SlotState}

    def summary(self) -> str:
        c = {state.value: sum(s.state is state for s in self.slots) for state in SlotState}
        return ", ".join(f"{n} {state}" for state, n in c.items() if n)

    def close(self) -> None:
        self.closed.set()
        with self.cond:
            for slot in self.slots:
                slot.state = SlotState.STOPPED
            self.cond.notify_all()
        if self.checker is not None:
            self.checker.join(timeout=self.timeout + 2 * PING_TIMEOUT_SEC)  # it may be inside a check
        for slot in self.slots:
            if slot.env is not None:
                slot.env.close()
                slot.env = None
        if self.on_close is not None:
            self.on_close()


class PooledEnv(gym.Env):
    """A gymnasium.Env on whichever slot of `pool` it holds.

    `reset()` acquires a slot if it holds none, and if that slot fails right away, tries the next one
    until `acquire_timeout`. A failure in `step()` marks the slot failed and raises SlotLost: the
    episode in progress is gone, and the caller must not use its data as if it had ended normally.
    The next `reset()` continues on another slot. `close()` restores the slot and gives it back.
    """

    metadata = {"render_modes": []}

    def __init__(self, pool: EnvPool, acquire_timeout: float = 1.0, avoid: frozenset[str] = frozenset()):
        self.pool, self.acquire_timeout, self.avoid = pool, acquire_timeout, frozenset(avoid)
        self.observation_space, self.action_space = pool.spaces()
        self.slot: Slot | None = None

    @property
    def slot_name(self) -> str | None:
        return self.slot.name if self.slot else None

    def _lose(self, error: ServiceError) -> SlotLost:
        slot, self.slot = self.slot, None
        self.pool.mark_failed(slot, error)
        return SlotLost(f"env slot {slot.name} failed: {error}")

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)  # the client's own RNG (gymnasium's contract); the env's is on the server
        deadline = time.monotonic() + self.acquire_timeout
        while True:
            if self.slot is None:
                self.slot = self.pool.acquire(max(0.0, deadline - time.monotonic()), self.avoid)
            try:
                self._check_suspect()
                return in_flight(self.slot, self.pool._connect(self.slot).reset, seed=seed, options=options)
            except ServiceError as exc:
                lost = self._lose(exc)
                if time.monotonic() >= deadline:
                    raise lost from exc

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self.slot is None:
            raise SlotLost("this env lost its slot: call reset() to continue on another one")
        try:
            self._check_suspect()
            return in_flight(self.slot, self.slot.env.step, action)
        except ServiceError as exc:
            raise self._lose(exc) from exc

    def _check_suspect(self) -> None:
        if self.slot.suspect:
            raise ServiceTimeout(f"{self.slot.address} timed out on another slot ({self.slot.last_error or 'no answer'})")

    def close(self) -> None:
        if self.slot is not None:
            slot, self.slot = self.slot, None
            self.pool.release(slot, restore=True)


def in_flight(slot: Slot, call: Callable, *args: Any, **kwargs: Any) -> Any:
    """`call` counted as a request in flight on `slot` while it runs (its server's load)."""
    slot.in_flight += 1
    try:
        return call(*args, **kwargs)
    finally:
        slot.in_flight -= 1


def server_answers(address: str) -> bool:
    """Whether the server at `address` answers a quick ping: after a timeout, tells a dead server from a
    stuck instance (the evaluator's runners ask, and tell the slot broker)."""
    return EnvPool._answers(address)
