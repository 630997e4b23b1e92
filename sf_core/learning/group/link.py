"""A learner group's collectives: the ranks join (`GroupSpec.join`), rank 0 broadcasts its commands, every
rank takes its share of a dataset and averages its gradients (`GroupLink`). gloo on the CPU, NCCL on GPUs."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, NamedTuple

import torch
import torch.distributed as dist

from sf_core.algo.meshes import parse_ranks
from sf_core.config import Config
from sf_core.learning.dataset_shares import ShareLayout, share_of
from sf_core.learning.group.collectives import (GroupError, average_over, collective, gather_over,  # noqa: F401
                                                 on_cpu, weights_digest)  # GroupError: imported from here too
from sf_core.learning.group.meshes import MeshLink
from sf_core.learning.group.network import ADDRESS, free_port, interface_towards

log = logging.getLogger("sf_core")

# the kinds of command rank 0 broadcasts; SEND_OPTIMIZERS: --model_ranks, rank 0 saves a checkpoint and asks each
# model's first rank for the optimizer state of a model it does not train itself
TRAIN, KEEP_WAITING, STOP, SEND_OPTIMIZERS = 0, 1, 2, 3
# Collectives wait this much longer than --heartbeat_timeout: a rank 0 stuck outside them (in a slot) is
# named by the runner's heartbeat check, not by the death of a rank whose wait for it timed out first
COLLECTIVE_GRACE_SEC = 30.0


class Command(NamedTuple):
    kind: int  # TRAIN, KEEP_WAITING or STOP
    index: int = 0  # the dataset to train on
    learning_rate: float = 0.0
    version: int = 0  # the policy version the dataset's lag is measured against


@dataclass(frozen=True)
class GroupSpec:
    """Where the ranks meet and what each trains on: made by the wiring, sent to every rank, joined there."""

    size: int
    port: int  # on `address`, where rank 0 serves the rendezvous
    timeout: float  # seconds the rendezvous and any collective may wait
    devices: tuple[str, ...]  # rank -> its device (a rank elsewhere: as its own machine numbers its GPUs)
    address: str = ADDRESS  # rank 0's: every other rank reaches it there, through its own interface towards it
    # ranks 1..N-1 run elsewhere (Ray actors): each receives its share of every dataset from rank 0, laid out so
    share_layout: ShareLayout | None = None
    # --model_ranks: each placed model's ranks (sf_core/learning/group/meshes.py); none: every model on every rank
    model_ranks: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def keepalive_interval(self) -> float:
        """How often an idle rank 0 tells the others to keep waiting: well within the collectives' timeout."""
        return min(5.0, self.timeout / 4)

    def join(self, rank: int) -> "GroupLink":
        """Blocks until every rank joined (or the timeout passed)."""
        device = self.devices[rank]
        interface = interface_towards(self.address)
        os.environ.update(MASTER_ADDR=self.address, MASTER_PORT=str(self.port), GLOO_SOCKET_IFNAME=interface,
                          NCCL_SOCKET_IFNAME=interface)
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(torch.device(device).index or 0)
        dist.init_process_group(backend, rank=rank, world_size=self.size, timeout=timedelta(seconds=self.timeout))
        if rank == 0:
            log.info("learner group: %d ranks joined (%s, %s:%d)", self.size, backend, self.address, self.port)
        link = GroupLink(rank, self.size, device, self.share_layout)
        if self.model_ranks:
            link.mesh = MeshLink(rank, self.size, device, dict(self.model_ranks))
        return link


def plan(cfg: Config, device: str) -> GroupSpec:
    """One machine: the group's meeting point and each rank's device. NCCL runs one rank per GPU: with a GPU,
    rank r takes the r-th GPU after the learner's."""
    n = cfg.num_learners
    devices = (device,) * n
    if device.startswith("cuda"):
        first, available = torch.device(device).index or 0, torch.cuda.device_count()
        if first + n > available:
            raise ValueError(f"--num_learners={n} on {device} needs {n} GPUs from cuda:{first} on (one per rank), "
                             f"but this machine has {available}")
        devices = (device,) + tuple(f"cuda:{first + r}" for r in range(1, n))
    return GroupSpec(n, free_port(), cfg.heartbeat_timeout + COLLECTIVE_GRACE_SEC, devices,
                     model_ranks=tuple(parse_ranks(cfg.model_ranks).items()))


def plan_elsewhere(cfg: Config, device: str, address: str, dataset: dict[str, torch.Tensor]) -> GroupSpec:
    """Ranks 1..N-1 elsewhere (Ray actors, each with a GPU of its own as cuda:0 with --device=cuda), meeting
    rank 0 at `address`, this machine's address as the other nodes see it; `dataset`: one of rank 0's."""
    n = cfg.num_learners
    devices = (device,) + ("cuda:0" if device.startswith("cuda") else "cpu",) * (n - 1)
    return GroupSpec(n, free_port(address), cfg.heartbeat_timeout + COLLECTIVE_GRACE_SEC, devices, address,
                     ShareLayout.of(share_of(dataset, 1, n)))


class GroupLink:
    """One rank's side of the group: its share of a dataset, and every collective the ranks make."""

    def __init__(self, rank: int, size: int, device: str, share_layout: ShareLayout | None = None):
        self.rank, self.size, self.device, self.layout = rank, size, device, share_layout
        self.buffers: list[torch.Tensor] = []  # ranks elsewhere: rank 0's outgoing shares, or this rank's incoming
        self.model: torch.nn.Module | None = None
        self.mesh: MeshLink | None = None  # --model_ranks

    def share(self, dataset: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """This rank's contiguous 1/N of the trajectories: views of the shared dataset, or, for ranks elsewhere,
        sent by rank 0 (which passes the whole dataset; the others pass None and receive theirs). With
        --model_ranks: the whole dataset, of which each train_step takes its model's share."""
        if self.mesh is not None:
            assert dataset is not None
            return dataset
        if self.layout is None:
            assert dataset is not None
            return share_of(dataset, self.rank, self.size)
        if not self.buffers:
            count = self.size - 1 if self.rank == 0 else 1
            self.buffers = [torch.empty(self.layout.nbytes, dtype=torch.uint8, device=self.device)
                            for _ in range(count)]
        if self.rank != 0:
            with collective("receiving a share of a dataset", self.rank):
                dist.recv(self.buffers[0], src=0)
            return self.layout.unpack(self.buffers[0])
        assert dataset is not None
        with collective("sending the ranks their shares of a dataset", self.rank):
            sends = []
            for rank, buffer in enumerate(self.buffers, start=1):
                self.layout.pack(share_of(dataset, rank, self.size), buffer)
                sends.append(dist.isend(buffer, dst=rank))
            for send in sends:
                send.wait()
        return share_of(dataset, 0, self.size)

    def start_identical(self, model: torch.nn.Module, optimizers: dict[str, Any]) -> dict[str, Any]:
        """Rank 0's weights (normalizers included) and the state of the optimizers that train them (a resumed
        run's; the actor-critic's, or its actor's and critic's with --split_actor_critic), by model, to every
        rank; a rank loads those of the models it trains that rank 0 trains too. Returns the graph context's
        hooks."""
        state = model.state_dict()
        moments = [{name: on_cpu(o.state_dict()) for name, o in optimizers.items()} if self.rank == 0 else None]
        with collective("the broadcast of rank 0's start", self.rank):
            for tensor in state.values():
                dist.broadcast(tensor, src=0)
            dist.broadcast_object_list(moments, src=0)
        model.load_state_dict(state)  # in place already; this clears the normalizers' cached float32 copies
        if self.rank != 0:
            for name, optimizer in optimizers.items():
                if name in moments[0]:
                    optimizer.load_state_dict(moments[0][name])
        self.model = model
        return {"average_gradients": self.average_gradients, "gather": self.gather}

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """The mean gradient over the ranks, in place: one all-reduce of every gradient in one buffer.

        Not DistributedDataParallel: the graph calls the model's parts by name (sequence, distribution, ...),
        never forward(), and DDP prepares its gradient reducer in forward(); a wrapper would also change
        the module every node and checkpoint sees. The all-reduce gives every rank the same sum, divided
        the same way, so every rank clips and steps identically."""
        average_over(parameters, None, self.size, self.rank)

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """`tensor` (same shape and dtype on every rank) from every rank, in rank order."""
        return gather_over(tensor.to(self.device), None, self.size, self.rank)

    def mean_stats(self, stats: dict[str, float]) -> dict[str, float]:
        """Each statistic over the ranks' shares: the mean, or the largest for a *_max. The iteration's last
        collective: once rank 0 has it, no rank reads the dataset, and the batcher may refill it."""
        if self.mesh is not None:
            return self.mesh.mean_stats(stats)
        keys = sorted(stats)
        values = torch.stack(self.gather(torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64)))
        return {k: float(values[:, i].max() if k.endswith("_max") else values[:, i].mean())
                for i, k in enumerate(keys)}

    def send_train(self, index: int, learning_rate: float, version: int) -> None:
        self._broadcast(Command(TRAIN, index, learning_rate, version))

    def send_optimizers_command(self) -> None:
        self._broadcast(Command(SEND_OPTIMIZERS))

    def send_keep_waiting(self) -> None:
        self._broadcast(Command(KEEP_WAITING))

    def receive(self) -> Command:
        """Ranks ≥ 1: rank 0's next command."""
        return self._broadcast(Command(KEEP_WAITING))

    def _broadcast(self, command: Command) -> Command:
        # float64 holds the learning rate exactly, and indices and versions far beyond any run's
        message = torch.tensor(command, dtype=torch.float64, device=self.device)
        with collective("the broadcast of a command", self.rank):
            dist.broadcast(message, src=0)
        kind, index, learning_rate, version = message.tolist()
        return Command(int(kind), int(index), learning_rate, int(version))

    def close(self) -> None:
        """Rank 0 tells the others to stop; then the ranks compare their weights (rank 0 logs the outcome). A
        rank already gone is not waited for."""
        try:
            if self.rank == 0:
                self._broadcast(Command(STOP))
            if self.model is not None and self.mesh is not None:
                for line in self.mesh.compare(self.model):
                    log.info(line)
            elif self.model is not None:
                self._compare_weights(self.model)
            dist.destroy_process_group()
        except RuntimeError as exc:  # GroupError, or destroy's own
            log.warning("learner rank %d: the group could not close cleanly: %s", self.rank, exc)

    def _compare_weights(self, model: torch.nn.Module) -> None:
        digests = [d.tolist() for d in self.gather(weights_digest(model).to(self.device))]
        if self.rank != 0:
            return
        if all(d == digests[0] for d in digests):
            log.info("learner group: %d ranks stopped with identical weights (sha256 %016x...)", self.size,
                     digests[0][0] & (2**64 - 1))
        else:
            differ = [r for r, d in enumerate(digests) if d != digests[0]]
            log.warning("learner group: the weights of rank(s) %s differ from rank 0's at stop", differ)
