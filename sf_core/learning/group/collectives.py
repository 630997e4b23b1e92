"""The collectives both kinds of learner group make (sf_core/learning/group/link.py for every model on every
rank, sf_core/learning/group/meshes.py for a group of ranks per model), and their one-line failure."""

from __future__ import annotations

import contextlib
import hashlib
import re
from typing import Any, Iterable, Iterator

import torch
import torch.distributed as dist


class GroupError(RuntimeError):
    """A collective of the learner group failed: another rank is gone (its process or its node) or stopped
    answering. The group cannot go on; rank 0 still saves its checkpoint."""

    MARK = "learner group: "  # how the runner tells it in a component's error details


@contextlib.contextmanager
def collective(what: str, rank: int) -> Iterator[None]:
    """A torch.distributed failure inside the block as a GroupError, in one line (gloo's own runs to three
    sentences and a traceback through the SGD step that called it)."""
    try:
        yield
    except RuntimeError as exc:  # torch.distributed.DistError and gloo's plain RuntimeErrors
        first = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip()).split(". ")[0]
        raise GroupError(f"{GroupError.MARK}{what} failed on rank {rank}: another rank is gone or not answering "
                         f"({first})") from None


def weights_digest(model: torch.nn.Module) -> torch.Tensor:
    """The first 16 bytes of a SHA-256 of every tensor of the state (normalizers included), as 2 int64s."""
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return torch.frombuffer(bytearray(h.digest()[:16]), dtype=torch.int64)


def on_cpu(value: Any) -> Any:
    """An optimizer's state with its tensors in host memory: what another rank can load wherever it trains."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: on_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [on_cpu(v) for v in value]
    return value


def average_over(parameters: Iterable[torch.nn.Parameter], group: Any, size: int, rank: int) -> None:
    """The mean gradient over the `size` ranks of `group` (None: every rank), in place: one all-reduce of every
    gradient in one buffer."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    with collective("the all-reduce of the gradients", rank):
        dist.all_reduce(flat, group=group)
    flat.div_(size)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def gather_over(tensor: torch.Tensor, group: Any, size: int, rank: int) -> list[torch.Tensor]:
    """`tensor` from each of the `size` ranks of `group` (None: every rank), in rank order."""
    out = [torch.empty_like(tensor) for _ in range(size)]
    with collective("an all-gather", rank):
        dist.all_gather(out, tensor, group=group)
    return out
