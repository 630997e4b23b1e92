"""The collectives of a learner group whose models train on ranks of their own (--model_ranks, algo/meshes.py).

Each placed model gets a process group of its ranks (`dist.new_group`, made by every rank in one order, as
torch.distributed requires): its gradient all-reduce and its statistics' all-gather stay among them. The
actor-critic's shared state (the observation normalisation) is folded on every rank, in the world group.

The hand-over. Rank 0 publishes the weights the inference workers act with, and checkpoints them: after every
training iteration it must hold every model's new parameters. A model rank 0 holds has them already; for each
other model, the first of its ranks sends rank 0 the model's own state (its parameters and the buffers no other
model shares, the returns normalisation of a critic) packed into one byte buffer: one point-to-point message
per model and iteration (gloo on the CPU, NCCL between GPUs), which only the two ranks take part in. Rank 0
keeps that copy frozen, with no optimizer (when it saves a checkpoint it asks the model's first rank for the
optimizer's state, so a resume goes on with every model's Adam moments); a rank that neither holds a model nor publishes drops the model's
state (parameters and buffers, their storage freed) when the group starts, and never fetches it.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sf_core.algo.graph import ModelSlot
from sf_core.algo.meshes import WHOLE, ModelHooks, RankMesh
from sf_core.algo.normalization import RunningMeanStd
from sf_core.learning.group.collectives import average_over, collective, gather_over, on_cpu, weights_digest

PUBLISHER = 0  # the rank that publishes the weights and saves checkpoints


def own_state(name: str, models: dict[str, ModelSlot]) -> dict[str, torch.Tensor]:
    """`name`'s tensors that no other model of the same whole holds (the actor's observation normalisation is
    the critic's too, and every rank's: not the actor's own)."""
    slot = models[name]
    shared = {t.data_ptr() for other, s in models.items() if other != name and s.part_of is not None
              and s.part_of == slot.part_of for t in s.module.state_dict().values()}
    return {key: t for key, t in slot.module.state_dict(keep_vars=True).items() if t.data_ptr() not in shared}


class MeshLink:
    """One rank's process groups of the placed models, the hand-over to rank 0, and the statistics."""

    def __init__(self, rank: int, size: int, device: str, ranks: dict[str, tuple[int, ...]]):
        self.rank, self.size, self.device, self.ranks = rank, size, device, ranks
        # every rank makes every group, in one order, even those it is not in (dist.new_group's contract)
        self.groups = {name: dist.new_group(list(held)) for name, held in sorted(ranks.items())}
        self.own: dict[str, dict[str, torch.Tensor]] = {}  # placed model -> its own state, where it is kept
        self.buffers: dict[str, torch.Tensor] = {}  # the hand-over's packed state, per model rank 0 lacks
        self.handover_bytes, self.handover_seconds = 0, 0.0
        self.shared_keys: list[str] = []  # the whole's state every rank trains: the observation normalisation
        self.state_of: dict[str, list[torch.Tensor]] = {}  # placed model -> its own state here, maybe freed
        self.models: dict[str, ModelSlot] = {}  # the models this rank trains

    def mesh(self, batch_size: int, world: ModelHooks) -> RankMesh:
        hooks = {name: self._hooks(name) for name, held in self.ranks.items() if self.rank in held}
        return RankMesh(self.rank, self.size, self.ranks, batch_size, {WHOLE: world, **hooks})

    def _hooks(self, name: str) -> ModelHooks:
        group, size = self.groups[name], len(self.ranks[name])
        return ModelHooks(lambda parameters: average_over(parameters, group, size, self.rank),
                          lambda tensor: gather_over(tensor.to(self.device), group, size, self.rank))

    def place(self, models: dict[str, ModelSlot]) -> dict[str, ModelSlot]:
        """`models` less those this rank does not train. Rank 0 keeps a frozen copy of each to publish; the
        other ranks drop them. Called once every rank starts from rank 0's weights."""
        placed = {t.data_ptr() for name in self.ranks for t in own_state(name, models).values()}
        self.shared_keys = [key for key, t in models[WHOLE].module.state_dict().items() if t.data_ptr() not in placed]
        for name, held in self.ranks.items():
            own = own_state(name, models)
            self.state_of[name] = list(own.values())
            if self.rank in held or self.rank == PUBLISHER:
                self.own[name] = own
            if self.rank not in held and self.rank == PUBLISHER:
                for tensor in own.values():
                    tensor.requires_grad_(False)
            elif self.rank not in held:
                for tensor in own.values():  # freed; an empty placeholder keeps the module's structure
                    tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        self.models = {name: slot for name, slot in models.items()
                       if name not in self.ranks or self.rank in self.ranks[name]}
        return self.models

    def holding(self, name: str) -> str:
        """What this rank holds of placed model `name`, read from its parameters and slots: "trains" (with an
        optimizer), "copy" (frozen) or "nothing" (its state's storage freed)."""
        state = self.state_of[name]
        if not any(t.numel() for t in state):
            return "nothing"
        slot = self.models.get(name)
        trains = (slot is not None and slot.optimizer is not None
                  and all(t.requires_grad for t in state if isinstance(t, nn.Parameter)))
        return "trains" if trains else "copy"

    def hand_over(self, whole: nn.Module) -> None:
        """Each model rank 0 does not train, from its first rank to rank 0: rank 0's copy is then current."""
        started = time.perf_counter()
        for name, held in sorted(self.ranks.items()):
            source = held[0]
            if PUBLISHER in held or self.rank not in (source, PUBLISHER):
                continue
            tensors = list(self.own[name].values())
            if name not in self.buffers:
                self.buffers[name] = torch.empty(_packed_bytes(tensors), dtype=torch.uint8, device=self.device)
            buffer = self.buffers[name]
            what = f"the hand-over of {name} to rank {PUBLISHER}"  # packing is no collective: its errors are its own
            if self.rank == source:
                _pack(tensors, buffer)
                with collective(what, self.rank):
                    dist.send(buffer, dst=PUBLISHER)
            else:
                with collective(what, self.rank):
                    dist.recv(buffer, src=source)
                _unpack(buffer, tensors)
                self.handover_bytes += buffer.numel()
        if self.rank == PUBLISHER:
            for module in whole.modules():
                if isinstance(module, RunningMeanStd):
                    module._invalidate()  # its statistics may have changed under it
            self.handover_seconds += time.perf_counter() - started

    def take_handover(self) -> dict[str, float]:
        """Rank 0: the bytes and milliseconds the hand-over took since the last call (summary statistics)."""
        if self.rank != PUBLISHER or not self.buffers:
            return {}
        found = {"handover_bytes": float(self.handover_bytes), "handover_ms": self.handover_seconds * 1e3}
        self.handover_bytes, self.handover_seconds = 0, 0.0
        return found

    def send_optimizers(self, models: dict[str, ModelSlot]) -> None:
        """The first rank of each model rank 0 does not train: its optimizer's state to rank 0, for a checkpoint."""
        for name, held in sorted(self.ranks.items()):
            if PUBLISHER not in held and self.rank == held[0]:
                with collective(f"sending rank {PUBLISHER} the optimizer state of {name}", self.rank):
                    dist.send_object_list([on_cpu(models[name].optimizer.state_dict())], dst=PUBLISHER)

    def receive_optimizers(self) -> dict[str, dict]:
        """Rank 0: the optimizer state of each model it does not train, from the model's first rank."""
        found = {}
        for name, held in sorted(self.ranks.items()):
            if PUBLISHER not in held:
                received: list[Any] = [None]
                with collective(f"receiving the optimizer state of {name}", self.rank):
                    dist.recv_object_list(received, src=held[0])
                found[name] = received[0]
        return found

    def mean_stats(self, stats: dict[str, float]) -> dict[str, float]:
        """Each statistic over the ranks that report it (a model's over its own ranks): the mean, or the largest
        for a *_max. The iteration's last collective, as `GroupLink.mean_stats`."""
        found: list[Any] = [None] * self.size
        with collective("an all-gather of the statistics", self.rank):
            dist.all_gather_object(found, stats)
        keys = sorted({key for reported in found for key in reported})
        values = {key: [reported[key] for reported in found if key in reported] for key in keys}
        return {key: max(v) if key.endswith("_max") else sum(v) / len(v) for key, v in values.items()}

    def compare(self, whole: nn.Module) -> list[str]:
        """Rank 0: a line per model, whether its ranks hold the same state, and a line per rank, the models it
        trains and those it keeps a copy of; the other ranks return none."""
        state = whole.state_dict()
        shared = {key: state[key] for key in self.shared_keys}
        holding = {name: self.holding(name) for name in self.ranks}
        report = {"holding": holding, "shared": _digest(shared),
                  "digests": {n: _digest(self.own[n]) for n, kind in holding.items() if kind != "nothing"}}
        found: list[Any] = [None] * self.size
        with collective("an all-gather of the ranks' weights", self.rank):
            dist.all_gather_object(found, report)
        if self.rank != PUBLISHER:
            return []
        lines = [_agreement(WHOLE + " (shared state)", list(range(self.size)), [r["shared"] for r in found])]
        for name, held in sorted(self.ranks.items()):
            copies = [r for r in range(self.size) if found[r]["holding"][name] == "copy"]
            lines.append(_agreement(name, list(held) + copies, [found[r]["digests"][name] for r in list(held) + copies],
                                    copies))
        for rank, r in enumerate(found):
            kinds = {kind: ", ".join(n for n, k in sorted(r["holding"].items()) if k == kind)
                     for kind in ("trains", "copy", "nothing")}
            lines.append(f"learner group: rank {rank} trains {kinds['trains'] or 'no model'}"
                         + (f"; a frozen copy of {kinds['copy']}" if kinds["copy"] else "")
                         + (f"; nothing of {kinds['nothing']}" if kinds["nothing"] else ""))
        return lines


def _agreement(name: str, ranks: list[int], digests: list, copies: tuple[int, ...] | list[int] = ()) -> str:
    trained = [str(r) for r in ranks if r not in copies]
    where = f"rank{'s' if len(trained) > 1 else ''} {', '.join(trained)}"
    where += "".join(f" and rank {r}'s copy" for r in copies)
    if len(digests) == 1:  # one rank and no copy: nothing to agree with
        return f"learner group: {name} on {where} (sha256 {digests[0]})"
    if all(d == digests[0] for d in digests):
        return f"learner group: {name} identical on {where} (sha256 {digests[0]})"
    return f"learner group: {name} differs between {where}"


def _digest(state: dict[str, torch.Tensor]) -> str:
    holder = nn.Module()
    for i, tensor in enumerate(state.values()):
        holder.register_buffer(f"t{i}", tensor.detach())
    return "".join(f"{v & (2**64 - 1):016x}" for v in weights_digest(holder).tolist())


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


ALIGN = 16  # bytes: each tensor starts where any dtype's view of the buffer may start (float64 needs 8)


def _offsets(tensors: list[torch.Tensor]) -> list[int]:
    """Where each tensor starts in the packed buffer: after the one before it, rounded up to ALIGN."""
    offsets, end = [], 0
    for t in tensors:
        offsets.append(-(-end // ALIGN) * ALIGN)
        end = offsets[-1] + _nbytes(t)
    return offsets


def _packed_bytes(tensors: list[torch.Tensor]) -> int:
    return _offsets(tensors)[-1] + _nbytes(tensors[-1]) if tensors else 0


def _pack(tensors: list[torch.Tensor], buffer: torch.Tensor) -> None:
    for t, offset in zip(tensors, _offsets(tensors)):
        buffer[offset:offset + _nbytes(t)].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))


@torch.no_grad()
def _unpack(buffer: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    for t, offset in zip(tensors, _offsets(tensors)):
        t.copy_(buffer[offset:offset + _nbytes(t)].view(t.dtype).view(t.shape))
