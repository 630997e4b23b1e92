"""A shard: what crosses machines. One learner dataset's columns (the sample schema's fields, time-major
`[rows, trajectories, ...]`, sf_core/contracts/sample.py) as numpy arrays, which Ray moves without pickling, plus
where they were sampled and the reports of the sampler's components since its previous shard."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from sf_core.contracts.signals import Report, RolloutReport


@dataclass
class ShardMeta:
    sampler: int
    incarnation: int  # how many times this sampler was started before (a replacement's shards are its own)
    node: str  # the Ray node id it ran on
    reports: list[Report] = field(default_factory=list)
    policy: int = 0  # whose dataset it is (--num_policies): its rows are those that policy acted on

    def frames(self) -> int:
        return sum(r.frames for r in self.reports if isinstance(r, RolloutReport))


@dataclass
class Shard:
    meta: ShardMeta
    arrays: dict[str, np.ndarray]

    def versions(self) -> tuple[int, int]:
        """The oldest and newest policy versions that acted in it."""
        v = self.arrays["policy_version"]
        return int(v.min()), int(v.max())


def arrays_of(dataset: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A dataset's tensors as numpy copies: the dataset buffer is refilled as soon as this returns."""
    return {key: tensor.numpy().copy() for key, tensor in dataset.items()}


def copy_into(dataset: dict[str, torch.Tensor], arrays: dict[str, np.ndarray]) -> None:
    """A shard into a dataset of the same schema; a shard of another shape (a node running other code or
    flags) is refused with the difference."""
    if set(arrays) != set(dataset):
        raise ValueError(f"a shard has fields {sorted(arrays)}, the learner's datasets {sorted(dataset)}: "
                         f"every node must run the same sf_core")
    for key, tensor in dataset.items():
        source, target = arrays[key], tensor.numpy()
        if source.shape != target.shape or source.dtype != target.dtype:
            raise ValueError(f"a shard's {key!r} is {source.shape} {source.dtype}, the learner's "
                             f"{target.shape} {target.dtype}: every node must train with the same flags")
        np.copyto(target, source)  # Ray's arrays are read-only views of its object store: read, never wrapped
