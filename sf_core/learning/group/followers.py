"""Ranks 1..N-1 of a learner group on the learner's machine: daemon processes of the runner, each training with
a trainer like rank 0's on its share of every dataset until rank 0 says stop."""

from __future__ import annotations

import os
import threading
import time
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from sf_core.contracts.buffers import DatasetBuffers, SharedWeights
from sf_core.common.process_name import name_process
from sf_core.contracts.component import configure_process
from sf_core.learning.group.link import SEND_OPTIMIZERS, STOP, TRAIN, GroupSpec

if TYPE_CHECKING:
    from sf_core.learning.learner import Trainer

RANK_PREFIX = "learner_rank_"


def rank_name(rank: int) -> str:
    """The process (or Ray actor) of rank `rank` ≥ 1 (rank 0 is the learner's process)."""
    return f"{RANK_PREFIX}{rank}"


def follower_processes(mp_context: Any, spec: GroupSpec, trainer: Trainer, datasets: DatasetBuffers,
                       weights: SharedWeights, torch_threads: int) -> list[BaseProcess]:
    """One machine: ranks 1..N-1 as daemon processes of the runner (`Topology.stop_processes` joins or kills them),
    each with a trainer like rank 0's (`trainer`, not built yet) on its own device."""
    return [mp_context.Process(target=follow, name=rank_name(rank), daemon=True,
                               args=(rank, spec, trainer.on_device(spec.devices[rank]), datasets, weights,
                                     os.getpid(), torch_threads))
            for rank in range(1, spec.size)]


def follow(rank: int, spec: GroupSpec, trainer: Trainer, datasets: DatasetBuffers, weights: SharedWeights,
           runner_pid: int, torch_threads: int) -> None:
    """A rank ≥ 1 on the learner's machine. If rank 0 dies, the collective it waits in fails at once (or times
    out); if the runner dies, `_exit_with` ends it."""
    name_process(rank_name(rank))
    configure_process(torch_threads)
    _exit_with(runner_pid)
    train_as_follower(rank, spec, trainer, datasets, weights)


def train_as_follower(rank: int, spec: GroupSpec, trainer: Trainer, datasets: DatasetBuffers | None = None,
                      weights: SharedWeights | None = None) -> None:
    """A rank ≥ 1: train on its share of each dataset rank 0 names, until rank 0 says stop. A rank elsewhere
    (no `datasets`, no `weights`) receives each share, and its start, from rank 0."""
    link = spec.join(rank)
    trainer.build(weights, None, link=link)
    while True:
        command = link.receive()
        if command.kind == STOP:
            break
        if command.kind == TRAIN:
            trainer.train(datasets[command.index] if datasets is not None else None, command.learning_rate,
                          command.version)
        if command.kind == SEND_OPTIMIZERS and link.mesh is not None:  # rank 0 saves a checkpoint
            link.mesh.send_optimizers(trainer.models)
    link.close()


def _exit_with(runner_pid: int) -> None:
    """What ParentWatchdog (sf_core/contracts/component.py) does for a component, on a thread: this process spends
    its time inside collectives, not on an event loop. Its parent is the runner, or the forkserver the runner
    restarts components from (which exits with the runner): whichever it is, this process ends when it goes, and
    when the runner does."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent or not _exists(runner_pid):
                os._exit(3)

    threading.Thread(target=watch, name="runner_watchdog", daemon=True).start()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:  # none, or another user's process took the number: the runner is gone
        return False
    return True
