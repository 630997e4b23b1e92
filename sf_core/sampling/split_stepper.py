"""Split steppers: with --env_service, each split of a rollout worker steps on a thread of its own.

A remote step is mostly waiting for servers. Stepped on the worker's event loop, one split's wait would
hold back every other split of the worker, and a worker with 4 slots of a 20 ms simulator would step
one split at a time. Here the event loop hands a split to its stepper thread and goes on; the thread
steps it (sending the split's requests at once, sf_core/service/batch_step.py), stores the outcome and
emits `envs_stepped` to the worker, which continues exactly as after a step on the loop.

While a split is out on its thread the event loop must not touch that split's runner (its slot, its
statistics): `in_flight` says which ones are; everything else about the worker stays on the loop.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from sf_core.contracts.signals import ENVS_STEPPED
from sf_core.sampling.split_runner import SplitRunner


@dataclass
class StepOutcome:
    has_truncation: bool = False
    error: BaseException | None = None
    seconds: float = 0.0


class SplitSteppers:
    def __init__(self, worker, runner: Callable[[int], SplitRunner], num_splits: int):
        self.worker, self.runner = worker, runner
        self.inboxes: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(num_splits)]
        self.outcomes: list[StepOutcome | None] = [None] * num_splits
        self.in_flight: set[int] = set()
        self.threads = [threading.Thread(target=self._loop, args=(s,), name=f"{worker.name}_split_{s}", daemon=True)
                        for s in range(num_splits)]
        for thread in self.threads:
            thread.start()

    def submit(self, split: int) -> None:
        self.in_flight.add(split)
        self.inboxes[split].put(split)

    def take(self, split: int) -> StepOutcome:
        """The outcome of the split's step (called when its `envs_stepped` arrives)."""
        self.in_flight.discard(split)
        outcome, self.outcomes[split] = self.outcomes[split], None
        return outcome or StepOutcome(error=RuntimeError(f"split {split} reported a step it never took"))

    def _loop(self, split: int) -> None:
        while self.inboxes[split].get() is not None:
            started = time.perf_counter()
            outcome = StepOutcome()
            try:
                outcome.has_truncation = self.runner(split).step()
            except BaseException as exc:  # noqa: BLE001 - handed to the event loop, which decides
                outcome.error = exc
            outcome.seconds = time.perf_counter() - started
            self.outcomes[split] = outcome
            ENVS_STEPPED.emit(self.worker, split)

    def close(self, timeout: float) -> None:
        """Stop the threads; a step still waiting on a server ends within its request timeout."""
        for inbox in self.inboxes:
            inbox.put(None)
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
