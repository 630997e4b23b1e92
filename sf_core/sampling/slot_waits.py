"""--env_service: a rollout worker's record of its splits against its pool of env slots (the worker decides,
sf_core/sampling/rollout_worker.py; this keeps count and says how long is too long).

- A split with no slot for every one of its envs is *parked*: it holds none meanwhile, so its envs' slots serve
  another split (a split steps only with all of its envs).
- A parked split waits without limit while the worker's other splits train and no slot of its pool is failed:
  the worker has fewer slots than envs (it runs with more envs than slots, for slots to be added; or slots
  were drained). While slots are failed, or none is left at all, it waits at most --env_service_down_timeout,
  then training stops.
- A split that gave back a drained slot at the end of a rollout starts new episodes with its next one
  (`restarting`); those episodes' ends never come, and are counted (`drain_cut_episodes`).
"""

from __future__ import annotations

import time

from sf_core.contracts.signals import ServiceReport
from sf_core.sampling.split_runner import EnvStepError
from sf_core.service.env_pool import EnvPool
from sf_core.service.service_set import PoolGroup


class SlotWaits:
    def __init__(self, envs_per_split: int, down_timeout: float):
        self.envs_per_split, self.down_timeout = envs_per_split, down_timeout
        self.parked: dict[int, float] = {}  # split -> since when
        self.down_since: dict[int, float] = {}  # parked splits waiting while slots are failed: since when
        self.restarting: set[int] = set()
        self.slot_faults = 0
        self.interrupted_episodes = 0  # episodes cut by a slot failure: never reported as finished
        self.drain_cut_episodes = 0
        self.reported = {"readmitted": 0, "joined": 0, "drained": 0}  # the pool's totals at the last report

    def park(self, split: int) -> None:
        self.parked.setdefault(split, time.time())

    def still_waiting(self, split: int, pool: EnvPool | PoolGroup, failure: Exception) -> None:
        """A retry found no slots again: EnvStepError once the pool has waited on servers for too long."""
        if not pool.waits_on_servers():
            self.down_since.pop(split, None)
            return
        waited = time.time() - self.down_since.setdefault(split, time.time())
        if waited > self.down_timeout:
            raise EnvStepError(f"split {split} found no healthy env slot for {waited:.0f}s "
                               f"(--env_service_down_timeout={self.down_timeout:g}): {failure}") from failure

    def resumed(self, split: int) -> float:
        """The split has its slots again; returns for how many seconds it had none."""
        self.down_since.pop(split, None)
        return time.time() - self.parked.pop(split)

    def failed(self) -> None:
        """A slot failed under a split: its trajectory and its envs' episodes are dropped."""
        self.slot_faults += 1
        self.interrupted_episodes += self.envs_per_split

    def drained(self, split: int) -> None:
        """The split gave back a drained slot after its rollout: new episodes with its next one."""
        self.restarting.add(split)
        self.drain_cut_episodes += self.envs_per_split

    def report(self, pool: EnvPool | PoolGroup) -> ServiceReport:
        """The pool's state now, and what happened since the last report."""
        totals = {"readmitted": pool.readmitted_total, "joined": pool.joined_total, "drained": pool.drained_total}
        new = {key: totals[key] - self.reported[key] for key in totals}
        report = ServiceReport(pool.counts(), self.slot_faults, self.interrupted_episodes, new["readmitted"],
                               len(self.parked) * self.envs_per_split, new["joined"], new["drained"],
                               self.drain_cut_episodes)
        self.slot_faults = self.interrupted_episodes = self.drain_cut_episodes = 0
        self.reported = totals
        return report
