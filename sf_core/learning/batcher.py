"""Batcher: turns finished trajectories into learner datasets. Runs on a thread beside the learner.

Signals in: new_trajectories, batch_consumed, stop. Out: batch_ready, slots_freed (sf_core/contracts/signals.py).

A dataset is `batch_size × num_batches_per_epoch` samples = that many / rollout trajectories, which
need not be a whole number of slots: a slot is freed once all of its trajectories were copied. With
--async_rl the slots are freed right after copying, so sampling goes on during training; without it, or
with --num_batches_to_accumulate, only after the learner has trained on them and published new weights
(then the buffers hold the datasets that may be collected ahead: none without --async_rl).

Each policy has its own batcher and datasets: it copies the trajectory rows its policy acted on.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from sf_core.config import Config
from sf_core.contracts.buffers import BufferLayout, DatasetBuffers, TrajectoryBuffers
from sf_core.contracts.component import Component, guarded
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.names import per_policy
from sf_core.contracts.sample import FIELDS
from sf_core.contracts.signals import BATCH_READY, SLOTS_FREED
from signal_slot.signal_slot import EventLoop


def batcher_name(policy: int, num_policies: int) -> str:
    return per_policy("batcher", policy, num_policies)


class Batcher(Component):
    def __init__(self, loop: EventLoop, cfg: Config, buffers: TrajectoryBuffers, datasets: DatasetBuffers,
                 layout: BufferLayout, control: ControlBlock | None = None, policy: int = 0):
        super().__init__(loop, batcher_name(policy, cfg.num_policies), control)
        self.cfg, self.buffers, self.datasets, self.layout, self.policy = cfg, buffers, datasets, layout, policy
        self.num_trajectories = cfg.dataset_size() // cfg.rollout
        self.ready: deque[tuple[int, int]] = deque()  # (slot, env row) trajectories not yet copied
        self.uncopied: dict[int, int] = {}  # slot -> trajectories of it still waiting
        self.free_datasets = deque(range(len(datasets)))
        self.filling: tuple[int, int] | None = None  # (dataset index, trajectories already in it)
        self.held: dict[int, list[int]] = {}  # dataset index -> slots to free once trained on (sync mode)
        # One policy copies a whole dataset at once (one gather per field). Several copy each slot's rows as
        # they come: a slot is shared by the policies acting in it, and holding it until one policy has a
        # whole dataset could leave every slot waiting on a policy that needs more of them.
        self.eager = cfg.num_policies > 1
        self.policy_id = buffers["policy_id"].numpy()
        self.report_timing()

    @guarded
    def new_trajectories(self, slot: int) -> None:
        if self.eager:  # the rows this policy acted on in at least one step
            rows = np.flatnonzero((self.policy_id[slot, :self.layout.rollout] == self.policy).any(axis=0)).tolist()
        else:
            rows = list(range(self.layout.rows_per_split))
        self.ready.extend((slot, e) for e in rows)
        self.uncopied[slot] = len(rows)
        self._build()

    @guarded
    def batch_consumed(self, index: int) -> None:
        self._free_slots(self.held.pop(index, []))
        self.free_datasets.append(index)
        self._build()

    def _build(self) -> None:
        D = self.num_trajectories
        while self.ready:
            if self.filling is None:
                if not self.free_datasets or (not self.eager and len(self.ready) < D):
                    return
                self.filling = (self.free_datasets.popleft(), 0)
            index, fill = self.filling
            self.beat("copying trajectories into a dataset")
            units = [self.ready.popleft() for _ in range(min(len(self.ready), D - fill))]
            started = time.perf_counter()
            self._copy(index, fill, units)
            self.clock.add("copy", time.perf_counter() - started)
            self._release(index, units)
            fill += len(units)
            self.filling = None if fill == D else (index, fill)
            if fill == D:
                BATCH_READY.emit(self, index)

    def _copy(self, index: int, fill: int, units: list[tuple[int, int]]) -> None:
        """Trajectories `units` into columns fill.. of dataset `index`, time-major. Rows another policy acted on
        are marked inactive: this policy's learner does not train on them."""
        T, dataset = self.layout.rollout, self.datasets[index]
        # one block copy per run of a slot's adjacent env rows (a whole slot, with one policy) and field: a
        # gather with index tensors instead copied Pong's observations at 0.2 GB/s, 27x slower (docs/performance.md)
        for column, slot, env, count in _runs(units, fill):
            for f in FIELDS:
                rows = f.rows(T)
                dataset[f.name][:, column:column + count].copy_(self.buffers[f.name][slot, :rows, env:env + count])
        if self.eager:
            columns = slice(fill, fill + len(units))
            dataset["inactive"][:, columns] |= dataset["policy_id"][:, columns] != self.policy

    def _release(self, index: int, units: list[tuple[int, int]]) -> None:
        """Slots whose every trajectory was copied are freed now (async) or once trained on (sync)."""
        done = []
        for slot, _ in units:
            self.uncopied[slot] -= 1
            if self.uncopied[slot] == 0:
                del self.uncopied[slot]
                done.append(slot)
        if self.cfg.datasets_ahead() is None:
            self._free_slots(done)
        else:
            self.held.setdefault(index, []).extend(done)

    def _free_slots(self, slots: list[int]) -> None:
        by_worker: dict[int, list[int]] = {}
        for slot in slots:
            self.buffers.holds.release(self.policy, slot)  # before the message (sf_core/contracts/slot_holds.py)
            by_worker.setdefault(self.layout.worker_of_slot(slot), []).append(slot)
        for worker, worker_slots in by_worker.items():
            SLOTS_FREED.emit_to(self, worker, worker_slots)

    @guarded
    def stop(self) -> None:
        self.stop_loop()


def _runs(units: list[tuple[int, int]], first_column: int) -> list[tuple[int, int, int, int]]:
    """(column, slot, first env row, count) for each run of units that are adjacent env rows of one slot."""
    runs: list[tuple[int, int, int, int]] = []
    for column, (slot, env) in enumerate(units, start=first_column):
        if runs and runs[-1][1] == slot and runs[-1][2] + runs[-1][3] == env:
            start, _, first_env, count = runs[-1]
            runs[-1] = (start, slot, first_env, count + 1)
        else:
            runs.append((column, slot, env, 1))
    return runs
