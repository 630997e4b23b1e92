"""The evaluator's slot broker: N task runners on M env slots, any N and M.

The coordinator's single-threaded loop owns the slot table (one `EnvPool` per named pool, with its
states and health checks) and is the only one that takes slots, so handing out a task and the lease of
every slot it needs is one step: all-or-none, with nobody to race against.

- Tasks wait in one FIFO line; idle runners in another (longest idle first).
- A task takes one slot of each pool it needs, or none. A task that cannot start holds its place on
  each of its pools: no later task takes a slot of those pools before it (FIFO per pool). So a task
  that needs `sim` and `reward` is not starved by tasks that need `sim` alone, and two tasks that need
  the same two pools cannot each hold one slot and wait for the other (no deadlock).
- A retried task prefers slots it has not failed on (EnvPool's `avoid`).
- Waiting for a busy slot is waiting in line, and not limited: a busy slot is healthy. A task whose
  pool has no healthy slot at all (every one failed) for `acquire_timeout` seconds counts as a failed
  attempt, as a task that could not acquire a slot always has.
- When the attempt ends, the runner has restored its slots already; the broker releases them, except
  a slot that failed: marked failed, health-checked and re-admitted by its pool's checker.
Without pools (envs built in-process), tasks need no slots and the broker only pairs tasks and runners.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sf_core.service.env_pool import EnvPool, Slot, SlotState


@dataclass
class Waiting:
    task: dict
    starved_since: float | None = None  # since when a pool it needs has had no healthy slot


class SlotBroker:
    def __init__(self, pools: dict[str, EnvPool], acquire_timeout: float):
        self.pools, self.acquire_timeout = pools, acquire_timeout
        self.waiting: deque[Waiting] = deque()
        self.idle: deque[int] = deque()  # one entry per idle runner: its worker
        self.leases: dict[str, dict[str, Slot]] = {}  # task id -> pool -> the slot it holds

    def submit(self, task: dict) -> None:
        self.waiting.append(Waiting(task))

    def runner_ready(self, worker: int) -> None:
        self.idle.append(worker)

    def forget_worker(self, worker: int) -> None:
        """A worker that is gone has no idle runners."""
        self.idle = deque(w for w in self.idle if w != worker)

    def dispatch(self, now: float) -> tuple[list[tuple[int, dict, dict[str, str]]], list[tuple[dict, str]]]:
        """Pair waiting tasks with idle runners and slots, in FIFO order. Returns the assignments
        (worker, task, {pool: slot name}) and the tasks that waited too long for a healthy slot
        (task, why): for the caller, failed attempts."""
        assigned, starved = [], []
        healthy = {name: self._healthy(pool) for name, pool in self.pools.items()}
        held: set[str] = set()  # pools an earlier waiting task is first in line for
        for item in list(self.waiting):
            needs = item.task["needs"]
            sick = [p for p in needs if p in healthy and not healthy[p]]
            if not sick:
                item.starved_since = None
            elif item.starved_since is None:
                item.starved_since = now
            elif now - item.starved_since >= self.acquire_timeout:
                self.waiting.remove(item)
                starved.append((item.task, f"PoolTimeout: no healthy slot in pool {sick[0]!r} within "
                                           f"{self.acquire_timeout:g}s ({self.pools[sick[0]].summary()})"))
                continue
            lease = None
            if self.idle and not held & set(needs):
                lease = self._take_all(needs, frozenset(item.task.get("avoid", ())))
            if lease is None:
                held.update(needs)
                continue
            self.waiting.remove(item)
            self.leases[item.task["id"]] = lease
            assigned.append((self.idle.popleft(), item.task, {p: s.name for p, s in lease.items()}))
        return assigned, starved

    @staticmethod
    def _healthy(pool: EnvPool) -> bool:
        return any(s.state in (SlotState.IDLE, SlotState.BUSY) for s in pool.slots)

    def _take_all(self, needs: list[str], avoid: frozenset[str]) -> dict[str, Slot] | None:
        taken: dict[str, Slot] = {}
        for name in needs:
            if name not in self.pools:
                continue  # an in-process env: nothing to lease
            slot = self.pools[name].try_acquire(avoid)
            if slot is None:
                for other, s in taken.items():
                    self.pools[other].untake(s)
                return None
            taken[name] = slot
        return taken

    def release(self, task_id: str, failed: dict[str, dict]) -> None:
        """The attempt ended: its slots come back, restored by the runner, except those in `failed`
        ({pool: {"error", "server_down"}}), which go out of service until a health check re-admits them."""
        for name, slot in self.leases.pop(task_id, {}).items():
            pool = self.pools[name]
            if name in failed:
                pool.mark_failed(slot, failed[name]["error"], server_down=failed[name].get("server_down", False))
            else:
                pool.release(slot, restore=False)

    def forfeit(self, task_id: str, why: str) -> dict[str, str]:
        """Its runner is gone with the task in hand: every slot it held is in an unknown state, so each goes
        to the health checks (which restore it before re-admitting it). Returns {pool: slot name}."""
        names = {name: slot.name for name, slot in self.leases.get(task_id, {}).items()}
        self.release(task_id, {name: {"error": why} for name in names})
        return names

    def summary(self) -> str:
        return "; ".join(f"{name}: {pool.summary()}" for name, pool in self.pools.items())

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
