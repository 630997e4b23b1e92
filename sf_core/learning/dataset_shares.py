"""How a learner group (sf_core/learning/group/) divides a dataset among its ranks, and how a share travels to a
rank that cannot read the dataset where it lies (a Ray actor on another node): packed into one byte buffer,
sent as one message, and unpacked there into views of that buffer."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def share_of(dataset: dict[str, torch.Tensor], rank: int, size: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s contiguous 1/`size` of a dataset's trajectories (dim 1): views, no copy."""
    columns = next(iter(dataset.values())).shape[1] // size
    return {key: t[:, rank * columns:(rank + 1) * columns] for key, t in dataset.items()}


SHARE_ALIGN = 64  # bytes: every field of a packed share starts aligned for any dtype's view


@dataclass(frozen=True)
class ShareLayout:
    """Where each field of one rank's share lies in the single byte buffer that carries it to a rank elsewhere:
    one message per rank and dataset, unpacked there into views of that buffer."""

    fields: tuple[tuple[str, tuple[int, ...], torch.dtype, int], ...]  # (key, shape, dtype, byte offset)
    nbytes: int

    @classmethod
    def of(cls, share: dict[str, torch.Tensor]) -> "ShareLayout":
        fields, offset = [], 0
        for key, t in share.items():
            fields.append((key, tuple(t.shape), t.dtype, offset))
            offset += -(-t.numel() * t.element_size() // SHARE_ALIGN) * SHARE_ALIGN
        return cls(tuple(fields), offset)

    def unpack(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each field as a view of `buffer` (uint8, `nbytes` long)."""
        out = {}
        for key, shape, dtype, offset in self.fields:
            count = torch.Size(shape).numel() * dtype.itemsize
            out[key] = buffer[offset:offset + count].view(dtype).view(shape)
        return out

    def pack(self, share: dict[str, torch.Tensor], buffer: torch.Tensor) -> None:
        for key, view in self.unpack(buffer).items():
            view.copy_(share[key])
