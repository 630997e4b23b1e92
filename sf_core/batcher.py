"""Batcher: turns finished trajectories into learner datasets. Runs on a thread beside the learner.

Signals in: new_trajectories, batch_consumed, stop. Out: batch_ready, slots_freed (sf_core/signals.py).

A dataset is `batch_size × num_batches_per_epoch` samples = that many / rollout trajectories, which
need not be a whole number of slots: a slot is freed once all of its trajectories were copied. With
--async_rl the slots are freed right after copying, so sampling goes on during training; without it,
only after the learner has trained on them and published new weights.
"""

from __future__ import annotations

from collections import deque

import torch

from sf_core.buffers import BufferLayout, DatasetBuffers, TrajectoryBuffers
from sf_core.component import Component, guarded
from sf_core.config import Config
from sf_core.control import ControlBlock
from sf_core.sample import FIELDS
from sf_core.signals import BATCH_READY, SLOTS_FREED
from signal_slot.signal_slot import EventLoop


class Batcher(Component):
    def __init__(self, loop: EventLoop, cfg: Config, buffers: TrajectoryBuffers, datasets: DatasetBuffers,
                 layout: BufferLayout, control: ControlBlock | None = None):
        super().__init__(loop, "batcher", control)
        self.cfg, self.buffers, self.datasets, self.layout = cfg, buffers, datasets, layout
        self.num_trajectories = cfg.dataset_size() // cfg.rollout
        self.ready: deque[tuple[int, int]] = deque()  # (slot, env) trajectories not yet copied
        self.uncopied: dict[int, int] = {}  # slot -> trajectories of it still waiting
        self.free_datasets = deque(range(len(datasets)))
        self.held: dict[int, list[int]] = {}  # dataset index -> slots to free once trained on (sync mode)

    @guarded
    def new_trajectories(self, slot: int) -> None:
        E = self.layout.rows_per_split
        self.ready.extend((slot, e) for e in range(E))
        self.uncopied[slot] = E
        self._build()

    @guarded
    def batch_consumed(self, index: int) -> None:
        self._free_slots(self.held.pop(index, []))
        self.free_datasets.append(index)
        self._build()

    def _build(self) -> None:
        while self.free_datasets and len(self.ready) >= self.num_trajectories:
            self.beat("copying trajectories into a dataset")
            index = self.free_datasets.popleft()
            units = [self.ready.popleft() for _ in range(self.num_trajectories)]
            slots = torch.tensor([u[0] for u in units])
            envs = torch.tensor([u[1] for u in units])
            T = self.layout.rollout
            for f in FIELDS:  # [n, rows, ...] gathered in one op, stored time-major
                source = self.buffers[f.name]
                self.datasets[index][f.name].copy_(source[slots, :f.rows(T), envs].transpose(0, 1))
            done = []
            for slot, _ in units:
                self.uncopied[slot] -= 1
                if self.uncopied[slot] == 0:
                    del self.uncopied[slot]
                    done.append(slot)
            if self.cfg.async_rl:
                self._free_slots(done)
            else:
                self.held[index] = done
            BATCH_READY.emit(self, index)

    def _free_slots(self, slots: list[int]) -> None:
        by_worker: dict[int, list[int]] = {}
        for slot in slots:
            by_worker.setdefault(self.layout.worker_of_slot(slot), []).append(slot)
        for worker, worker_slots in by_worker.items():
            SLOTS_FREED.emit_to(self, worker, worker_slots)

    @guarded
    def stop(self) -> None:
        self.stop_loop()
