"""Shard emitter: in a sampler, the learner's place. Each dataset the batcher fills becomes a shard in the
sampler's outbox, where the driver's next `next_shard` call takes it (sf_core/cluster/sampler.py).

Signals in: batch_ready, shard_taken, stop. Out: batch_consumed (sf_core/contracts/signals.py).

Each policy has its batcher and emitter (--num_policies); all put (policy, arrays) into the sampler's one
outbox, which holds --shards_in_flight shards per policy. While it is full the emitter keeps the dataset, so the batcher
stops freeing trajectory slots and the workers wait: a node never samples further ahead of the learner than
that, which is what bounds policy lag across the cluster.
"""

from __future__ import annotations

import queue
from collections import deque

from sf_core.cluster.shards import arrays_of
from sf_core.contracts.buffers import DatasetBuffers
from sf_core.contracts.component import Component, guarded
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.names import per_policy
from sf_core.contracts.signals import BATCH_CONSUMED, SHARD_TAKEN
from signal_slot.signal_slot import EventLoop


def shard_emitter_name(policy: int, num_policies: int) -> str:
    return per_policy("shard_emitter", policy, num_policies)


class ShardEmitter(Component):
    def __init__(self, loop: EventLoop, datasets: DatasetBuffers, outbox: queue.Queue, control: ControlBlock,
                 policy: int = 0, num_policies: int = 1):
        super().__init__(loop, shard_emitter_name(policy, num_policies), control)
        self.datasets, self.outbox, self.policy = datasets, outbox, policy
        self.waiting: deque[int] = deque()  # full datasets not yet in the outbox
        SHARD_TAKEN.connect(self, self.shard_taken)  # the sampler's call thread: the outbox has room again

    @guarded
    def batch_ready(self, index: int) -> None:
        self.waiting.append(index)
        self._fill_outbox()

    @guarded
    def shard_taken(self) -> None:
        self._fill_outbox()

    def _fill_outbox(self) -> None:
        while self.waiting and not self.outbox.full():
            index = self.waiting.popleft()
            self.outbox.put_nowait((self.policy, arrays_of(self.datasets[index])))
            BATCH_CONSUMED.emit(self, index)

    @guarded
    def stop(self) -> None:
        self.stop_loop()
