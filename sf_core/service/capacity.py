"""The capacity arithmetic of env services: how the slots of every pool are divided among the rollout workers.

Slots are numbered address by address. Each worker gets a contiguous slice of every pool, so it keeps
talking to the same few addresses; when a pool's slots do not divide evenly, the first workers get one spare
slot each, which their pool uses when another slot fails. An env holds one slot of every pool, so a worker
runs as many envs as its smallest share of a pool: that pool is the bottleneck.

The trainer (`training_share`, `worker_slice`) and `python -m sf_core.fleet` (its printout) both compute
from `plan_capacity`, so what the fleet prints is what the trainer does.
"""

from __future__ import annotations

from dataclasses import dataclass

from sf_core.service.addresses import Endpoint, ServiceConfigError, SlotAddress

MAX_WORKERS_SHOWN = 8  # a printout lists the first workers' slices; the rest follow the same rule


def all_slots(endpoints: list[Endpoint]) -> list[SlotAddress]:
    return [SlotAddress(e.host, e.port, i) for e in endpoints for i in range(e.capacity)]


def describe(endpoints: list[Endpoint]) -> str:
    return " + ".join(str(e) for e in endpoints)


def envs_per_worker(endpoints: list[Endpoint], num_workers: int) -> int:
    """Each worker's share of the slots: the envs it runs. Rejects capacity that cannot feed every worker."""
    total = sum(e.capacity for e in endpoints)
    if total < num_workers:
        raise ServiceConfigError(
            f"--env_service has {describe(endpoints)} = {total} slot{'s' if total != 1 else ''} but "
            f"--num_workers={num_workers}: each rollout worker needs at least one slot ({total} < {num_workers}); "
            f"use --num_workers={total} or fewer, or add capacity")
    return total // num_workers


def worker_slice(endpoints: list[Endpoint], num_workers: int, worker: int) -> list[SlotAddress]:
    """Worker `worker`'s contiguous slice: its share, plus one spare slot for the first total % W workers."""
    slots = all_slots(endpoints)
    share, extra = divmod(len(slots), num_workers)
    start = worker * share + min(worker, extra)
    return slots[start:start + share + (1 if worker < extra else 0)]


@dataclass(frozen=True)
class PoolShare:
    """One pool's slots divided among the workers."""

    name: str  # "" for the one pool of a plain --env_service value
    endpoints: tuple[Endpoint, ...]
    workers: int
    share: int  # envs per worker this pool alone would allow

    @property
    def slots(self) -> int:
        return sum(e.capacity for e in self.endpoints)

    def worker_slots(self, worker: int) -> list[SlotAddress]:
        return worker_slice(list(self.endpoints), self.workers, worker)

    def addresses_times_concurrency(self) -> str:
        capacities = {e.capacity for e in self.endpoints}
        if len(capacities) == 1:
            return f"{len(self.endpoints)} × {capacities.pop()}"
        return describe(list(self.endpoints))


@dataclass(frozen=True)
class CapacityPlan:
    workers: int
    pools: dict[str, PoolShare]

    @property
    def envs_per_worker(self) -> int:
        return min(p.share for p in self.pools.values())

    @property
    def bottleneck(self) -> str:
        """The pool with the fewest slots per worker (the first such, in the order given)."""
        return min(self.pools.values(), key=lambda p: p.share).name

    def arithmetic(self) -> str:
        """One line: how each worker's envs follow from the slots (errors about the flags quote it)."""
        if list(self.pools) == [""]:
            pool = self.pools[""]
            return (f"{describe(list(pool.endpoints))} = {pool.slots} slots // {self.workers} workers = "
                    f"{pool.share} envs per worker")
        parts = [f"pool {p.name}: {p.slots} slots // {self.workers} workers = {p.share}" for p in self.pools.values()]
        return f"one slot of every pool per env ({'; '.join(parts)}) = {self.envs_per_worker} envs per worker"

    def table(self, notes: dict[str, str] | None = None) -> list[str]:
        """The printout: per pool its addresses × concurrency and each worker's share, each worker's slots,
        the smallest pool and the bottleneck. `notes` adds a column: how each pool is deployed."""
        notes = notes or {}
        rows = [("service", "addresses × concurrency", "slots", "per worker", "deployment")]
        for p in self.pools.values():
            spare = p.slots % self.workers
            rows.append((p.name, p.addresses_times_concurrency(), str(p.slots),
                         f"{p.slots} // {self.workers} = {p.share}" + (f" (+1 spare: first {spare})" if spare else ""),
                         notes.get(p.name, "")))
        widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
        lines = [f"capacity for {self.workers} rollout worker{'s' if self.workers != 1 else ''}:"]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        for w in range(min(self.workers, MAX_WORKERS_SHOWN)):
            mine = "; ".join(f"{p.name} {compact(p.worker_slots(w))}" for p in self.pools.values())
            lines.append(f"  worker {w}: {mine}")
        if self.workers > MAX_WORKERS_SHOWN:
            lines.append(f"  ... (workers {MAX_WORKERS_SHOWN}-{self.workers - 1} alike)")
        lines.append(self.summary())
        return lines

    def summary(self) -> str:
        least = self.pools[self.bottleneck]
        idle = [f"{p.name} {p.share - least.share}" for p in self.pools.values() if p.share > least.share]
        text = (f"smallest pool: {least.name}, {least.slots} slots = {least.share} per worker, so "
                f"{_envs(self.envs_per_worker)} per worker, {self.envs_per_worker * self.workers} in all; "
                f"bottleneck: {least.name}")
        if idle:
            text += f" (slots per worker left idle by it: {', '.join(idle)})"
        return text


def plan_capacity(pools: dict[str, list[Endpoint]], workers: int) -> CapacityPlan:
    """The division of every pool's slots among `workers` rollout workers; ServiceConfigError, with the
    arithmetic, when a pool has fewer slots than workers."""
    shares = {name: PoolShare(name, tuple(endpoints), workers, envs_per_worker(endpoints, workers))
              for name, endpoints in pools.items()}
    return CapacityPlan(workers, shares)


def _envs(n: int) -> str:
    return f"{n} env{'s' if n != 1 else ''}"


def compact(slots: list[SlotAddress]) -> str:
    """Slots as `host:port#first-last` runs, one per address: `127.0.0.1:6000#0-1 127.0.0.1:6001#0`."""
    runs: list[list] = []
    for s in slots:
        if runs and runs[-1][0] == (s.host, s.port) and runs[-1][2] == s.index - 1:
            runs[-1][2] = s.index
        else:
            runs.append([(s.host, s.port), s.index, s.index])
    return " ".join(f"{h}:{p}#{a}" + (f"-{b}" if b != a else "") for (h, p), a, b in runs) or "-"

