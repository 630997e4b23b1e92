"""Which idle slot a pool hands out next (sf_core/service/env_pool.py).

`LeastLoaded`, the default: the slot whose server has the fewest steps in flight from this pool right now,
ties broken by the fewest uses. A step is in flight from the moment its request is sent until its reply
(or its failure) is read, whichever path sent it: `PooledEnv`, a batched `steps` message, or calls at
once (sf_core/service/concurrent_calls.py). A slow server keeps its steps in flight longer, so work that
comes and goes (a task, an episode) lands on the faster servers more often.

`LeastUsed`: the fewest uses only, the rule before least-loaded; kept for comparison
(`scripts/bench_env_service.py --phase=least_loaded`).

Only steps sent by the pool's own process count: the evaluator's slot broker leases slots to task runners
in other processes, whose steps it does not see, so there every server looks idle and the uses decide.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol


class Slot(Protocol):
    """What a choice reads of a pool's slot (sf_core/service/env_pool.py's Slot)."""

    address: str
    uses: int
    in_flight: int


class SlotChoice:
    """Picks one of a pool's candidate slots (idle and healthy); `slots` is the whole pool."""

    def pick(self, candidates: list[Slot], slots: list[Slot]) -> Slot:
        raise NotImplementedError


class LeastUsed(SlotChoice):
    def pick(self, candidates: list[Slot], slots: list[Slot]) -> Slot:
        return min(candidates, key=lambda s: s.uses)


class LeastLoaded(SlotChoice):
    def pick(self, candidates: list[Slot], slots: list[Slot]) -> Slot:
        in_flight: Counter = Counter()
        for slot in slots:
            in_flight[slot.address] += slot.in_flight
        return min(candidates, key=lambda s: (in_flight[s.address], s.uses))
