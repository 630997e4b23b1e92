"""Slot holds: which policies' batchers hold each trajectory slot, in shared memory.

A rollout worker marks a slot held by policy p just before it sends `new_trajectories` to p's batcher; that
batcher clears its mark just before it sends `slots_freed` back. The worker fills a slot again only once no
policy holds it. Messages say when to look; the holds say what is true. That is what lets a rollout worker's
process be replaced (sf_core/run/worker_replacement.py): the new process starts with the slots its
predecessor left with the batchers still held, whatever signals died with the old process, and a
`slots_freed` meant for the old process (late, or for a slot sent again since) changes nothing.

Each mark has one writer at a time (the worker sets it while it owns the slot, the batcher clears it while it
holds it), and a batcher clears before it emits, so a worker never sees the message before the mark is clear.
"""

from __future__ import annotations

import functools

import numpy as np
import torch


class SlotHolds:
    def __init__(self, num_policies: int, num_slots: int):
        self.table = torch.zeros((num_policies, num_slots), dtype=torch.bool).share_memory_()

    def __getstate__(self) -> dict:
        return {"table": self.table}  # the numpy view is made again where it is unpickled

    @functools.cached_property
    def view(self) -> np.ndarray:
        return self.table.numpy()

    def hold(self, policy: int, slot: int) -> None:
        """A rollout worker, before it sends `slot` to policy `policy`'s batcher."""
        self.view[policy, slot] = True

    def release(self, policy: int, slot: int) -> None:
        """Policy `policy`'s batcher, before it tells the worker the slot is free."""
        self.view[policy, slot] = False

    def is_free(self, slot: int) -> bool:
        return not self.view[:, slot].any()
