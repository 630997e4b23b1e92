"""`PooledEnv`: a gymnasium.Env on whichever slot of an env pool (sf_core/service/env_pool.py) it holds."""

from __future__ import annotations

import time
from typing import Any, Callable

import gymnasium as gym

from sf_core.service.env_pool import EnvPool
from sf_core.service.slot import Slot, SlotLost, SlotState
from sf_core.service.remote_env import ServiceError, ServiceTimeout


class PooledEnv(gym.Env):
    """A gymnasium.Env on whichever slot of `pool` it holds.

    `reset()` acquires a slot if it holds none, and if that slot fails right away, tries the next one
    until `acquire_timeout`. A failure in `step()` marks the slot failed and raises SlotLost: the
    episode in progress is gone, and the caller must not use its data as if it had ended normally.
    The next `reset()` continues on another slot. `close()` restores the slot and gives it back.
    `draining` says that its slot is being drained (it leaves the pool when given back, sf_core/service/
    env_pool.py): the holder gives it back (`let_go()`) where its work can end normally.
    """

    metadata = {"render_modes": []}

    def __init__(self, pool: EnvPool, acquire_timeout: float = 1.0, avoid: frozenset[str] = frozenset()):
        self.pool, self.acquire_timeout, self.avoid = pool, acquire_timeout, frozenset(avoid)
        self.observation_space, self.action_space = pool.spaces()
        self.slot: Slot | None = None

    @property
    def slot_name(self) -> str | None:
        return self.slot.name if self.slot else None

    @property
    def draining(self) -> bool:
        return self.slot is not None and self.slot.state is SlotState.DRAINING

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

    def let_go(self) -> None:
        """Give the slot back, restored (a draining one leaves the pool instead); the env itself stays usable:
        its next `reset()` acquires another."""
        if self.slot is not None:
            slot, self.slot = self.slot, None
            self.pool.release(slot, restore=True)

    def close(self) -> None:
        self.let_go()


def in_flight(slot: Slot, call: Callable, *args: Any, **kwargs: Any) -> Any:
    """`call` counted as a request in flight on `slot` while it runs (its server's load)."""
    slot.in_flight += 1
    try:
        return call(*args, **kwargs)
    finally:
        slot.in_flight -= 1
