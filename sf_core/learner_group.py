"""A learner group (--num_learners=N): N processes train one policy, data-parallel, with torch.distributed.

Rank 0 is the policy's learner (sf_core/learner.py): the only rank the other components know; it publishes
the weights, saves checkpoints and reports. Ranks 1..N-1 are plain processes started beside it (`follow`),
not event-loop components: each waits for rank 0's next command, a broadcast of a small tensor (train on
dataset k with this learning rate and policy version, keep waiting, or stop), and trains with the same
`Trainer`. Each rank takes its contiguous 1/N of the dataset's trajectories (shared memory, no copy) in
minibatches of --batch_size / N, and at every SGD step the ranks average their gradients with one
all-reduce: every rank takes the same step from the same weights and optimizer state, so all hold the
same weights, bit for bit. They meet on the loopback interface only (gloo on the CPU, NCCL on GPUs).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Any, Iterable, NamedTuple

import torch
import torch.distributed as dist

from sf_core import checkpoint
from sf_core.buffers import DatasetBuffers, SharedWeights
from sf_core.component import configure_process
from sf_core.config import Config, ConfigError
from sf_core.learner import Trainer

log = logging.getLogger("sf_core")

ADDRESS = "127.0.0.1"
LOOPBACK_INTERFACE = "lo0" if sys.platform == "darwin" else "lo"
TRAIN, KEEP_WAITING, STOP = 0, 1, 2  # the kinds of command rank 0 broadcasts
# Collectives wait this much longer than --heartbeat_timeout: a rank 0 stuck outside them (in a slot) is
# named by the runner's heartbeat check, not by the death of a rank whose wait for it timed out first
COLLECTIVE_GRACE_SEC = 30.0
RANK_PREFIX = "learner_rank_"


def rank_name(rank: int) -> str:
    """The process of rank `rank` ≥ 1 (rank 0 is the learner's process)."""
    return f"{RANK_PREFIX}{rank}"


def check_flags(cfg: Config) -> None:
    """What --num_learners > 1 needs of the other flags (called by Config.validate)."""
    n = cfg.num_learners
    if cfg.with_pbt:
        raise ConfigError(f"--num_learners={n} cannot run with --with_pbt: a learner group trains one policy, and "
                          f"PBT needs a population of them")
    if cfg.num_policies != 1:
        raise ConfigError(f"--num_learners={n} needs --num_policies=1, got {cfg.num_policies}: a learner group "
                          f"trains one policy")
    if cfg.serial_mode:
        raise ConfigError(f"--num_learners={n} cannot run with --serial_mode=True: the other learner ranks are "
                          f"processes of their own")
    trajectories = cfg.dataset_size() // cfg.rollout
    if trajectories % n:
        raise ConfigError(f"--num_learners={n} must divide the dataset's {trajectories} trajectories (--batch_size × "
                          f"--num_batches_per_epoch / --rollout = {cfg.batch_size} × {cfg.num_batches_per_epoch} / "
                          f"{cfg.rollout}): each rank trains on an equal share")
    if cfg.batch_size % n:
        raise ConfigError(f"--num_learners={n} must divide --batch_size={cfg.batch_size}: each rank's minibatch is "
                          f"--batch_size / --num_learners samples")
    length = cfg.recurrence_length()
    if (cfg.batch_size // n) % length:
        raise ConfigError(f"each rank's minibatch of --batch_size / --num_learners = {cfg.batch_size} / {n} = "
                          f"{cfg.batch_size // n} samples must be a multiple of --recurrence={length}: ranks train "
                          f"on whole sequences")


class Command(NamedTuple):
    kind: int  # TRAIN, KEEP_WAITING or STOP
    index: int = 0  # the dataset to train on
    learning_rate: float = 0.0
    version: int = 0  # the policy version the dataset's lag is measured against


@dataclass(frozen=True)
class GroupSpec:
    """Where the ranks meet and what each trains on: made by the wiring, sent to every rank, joined there."""

    size: int
    port: int  # on ADDRESS, where rank 0 serves the rendezvous
    timeout: float  # seconds the rendezvous and any collective may wait
    devices: tuple[str, ...]  # rank -> its device

    def keepalive_interval(self) -> float:
        """How often an idle rank 0 tells the others to keep waiting: well within the collectives' timeout."""
        return min(5.0, self.timeout / 4)

    def join(self, rank: int) -> "GroupLink":
        """Blocks until every rank joined (or the timeout passed)."""
        device = self.devices[rank]
        os.environ.update(MASTER_ADDR=ADDRESS, MASTER_PORT=str(self.port), GLOO_SOCKET_IFNAME=LOOPBACK_INTERFACE,
                          NCCL_SOCKET_IFNAME=LOOPBACK_INTERFACE)
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(torch.device(device).index or 0)
        dist.init_process_group(backend, rank=rank, world_size=self.size, timeout=timedelta(seconds=self.timeout))
        if rank == 0:
            log.info("learner group: %d ranks joined (%s, %s:%d)", self.size, backend, ADDRESS, self.port)
        return GroupLink(rank, self.size, device)


def plan(cfg: Config, device: str) -> GroupSpec:
    """The group's meeting point and each rank's device. NCCL runs one rank per GPU: with a GPU, rank r takes
    the r-th GPU after the learner's."""
    n = cfg.num_learners
    devices = (device,) * n
    if device.startswith("cuda"):
        first, available = torch.device(device).index or 0, torch.cuda.device_count()
        if first + n > available:
            raise ValueError(f"--num_learners={n} on {device} needs {n} GPUs from cuda:{first} on (one per rank), "
                             f"but this machine has {available}")
        devices = (device,) + tuple(f"cuda:{first + r}" for r in range(1, n))
    return GroupSpec(n, free_port(), cfg.heartbeat_timeout + COLLECTIVE_GRACE_SEC, devices)


def free_port() -> int:
    """A port nothing listens on now, on the loopback interface, for rank 0's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ADDRESS, 0))
        return s.getsockname()[1]


class GroupLink:
    """One rank's side of the group: its share of a dataset, and every collective the ranks make."""

    def __init__(self, rank: int, size: int, device: str):
        self.rank, self.size, self.device = rank, size, device

    def share(self, dataset: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's contiguous 1/N of the trajectories (dim 1): views of the shared dataset."""
        columns = next(iter(dataset.values())).shape[1] // self.size
        return {key: t[:, self.rank * columns:(self.rank + 1) * columns] for key, t in dataset.items()}

    def start_identical(self, model: torch.nn.Module) -> dict[str, Any]:
        """Rank 0's weights (normalizers included) to every rank; returns the graph context's hooks."""
        state = model.state_dict()
        for tensor in state.values():
            dist.broadcast(tensor, src=0)
        model.load_state_dict(state)  # in place already; this clears the normalizers' cached float32 copies
        return {"average_gradients": self.average_gradients, "gather": self.gather}

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """The mean gradient over the ranks, in place: one all-reduce of every gradient in one buffer.

        Not DistributedDataParallel: the graph calls the model's parts by name (sequence, distribution, ...),
        never forward(), and DDP prepares its gradient reducer in forward(); a wrapper would also change
        the module every node and checkpoint sees. The all-reduce gives every rank the same sum, divided
        the same way, so every rank clips and steps identically."""
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat.div_(self.size)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """`tensor` (same shape and dtype on every rank) from every rank, in rank order."""
        tensor = tensor.to(self.device)
        out = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(out, tensor)
        return out

    def mean_stats(self, stats: dict[str, float]) -> dict[str, float]:
        """Each statistic over the ranks' shares: the mean, or the largest for a *_max. The iteration's last
        collective: once rank 0 has it, no rank reads the dataset, and the batcher may refill it."""
        keys = sorted(stats)
        values = torch.stack(self.gather(torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64)))
        return {k: float(values[:, i].max() if k.endswith("_max") else values[:, i].mean())
                for i, k in enumerate(keys)}

    def send_train(self, index: int, learning_rate: float, version: int) -> None:
        self._broadcast(Command(TRAIN, index, learning_rate, version))

    def send_keep_waiting(self) -> None:
        self._broadcast(Command(KEEP_WAITING))

    def receive(self) -> Command:
        """Ranks ≥ 1: rank 0's next command."""
        return self._broadcast(Command(KEEP_WAITING))

    def _broadcast(self, command: Command) -> Command:
        # float64 holds the learning rate exactly, and indices and versions far beyond any run's
        message = torch.tensor(command, dtype=torch.float64, device=self.device)
        dist.broadcast(message, src=0)
        kind, index, learning_rate, version = message.tolist()
        return Command(int(kind), int(index), learning_rate, int(version))

    def close(self) -> None:
        """Rank 0 tells the others to stop; a rank already gone is not waited for."""
        try:
            if self.rank == 0:
                self._broadcast(Command(STOP))
            dist.destroy_process_group()
        except (RuntimeError, dist.DistError) as exc:
            log.warning("learner rank %d: the group could not close cleanly: %s", self.rank, exc)


def follower_processes(mp_context: Any, spec: GroupSpec, trainer: Trainer, datasets: DatasetBuffers,
                       weights: SharedWeights, resume_from: str | None, torch_threads: int) -> list[BaseProcess]:
    """Ranks 1..N-1 as daemon processes of the runner (its `_stop_processes` joins or kills them), each
    with a trainer like rank 0's (`trainer`, not built yet) on its own device."""
    return [mp_context.Process(target=follow, name=rank_name(rank), daemon=True,
                               args=(rank, spec, trainer.on_device(spec.devices[rank]), datasets, weights, resume_from,
                                     os.getpid(), torch_threads))
            for rank in range(1, spec.size)]


def follow(rank: int, spec: GroupSpec, trainer: Trainer, datasets: DatasetBuffers, weights: SharedWeights,
           resume_from: str | None, runner_pid: int, torch_threads: int) -> None:
    """A rank ≥ 1: train on its share of each dataset rank 0 names, until rank 0 says stop. If rank 0 dies,
    the collective it waits in fails at once (or times out); if the runner dies, `_exit_with` ends it."""
    configure_process(torch_threads)
    _exit_with(runner_pid)
    state = checkpoint.load(resume_from, map_location=trainer.device) if resume_from else None
    link = spec.join(rank)
    trainer.build(weights, state, link=link)
    while True:
        command = link.receive()
        if command.kind == STOP:
            break
        if command.kind == TRAIN:
            trainer.train(datasets[command.index], command.learning_rate, command.version)
    link.close()


def _exit_with(runner_pid: int) -> None:
    """What ParentWatchdog (sf_core/component.py) does for a component, on a thread: this process spends
    its time inside collectives, not on an event loop."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != runner_pid:
                os._exit(3)

    threading.Thread(target=watch, name="runner_watchdog", daemon=True).start()
