"""Observation spaces the model understands, and how structured observations are stored.

A `Box` observation is stored as it is. A `Dict` or `Tuple` observation (possibly nested) is packed
into one row of bytes per step: every field's raw bytes at an 8-byte aligned offset. The trajectory
buffers, the batcher and the learner then handle every observation space as one tensor, and the
model unpacks the fields with zero-copy dtype views (`PackedObs.unpack`). Field keys are paths:
`"image"`, `"state/position"`, `"0"` for a Tuple's first element.

Supported leaves: `Box` (any shape; 3 dims = an image), `Discrete` (stored as int64, one-hot
encoded by the model) and `MultiBinary` (stored as float32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

ALIGN = 8


@dataclass(frozen=True)
class ObsField:
    key: str
    space: gym.Space
    shape: tuple[int, ...]  # as stored
    dtype: np.dtype  # as stored
    offset: int
    nbytes: int

    @property
    def is_image(self) -> bool:
        return isinstance(self.space, gym.spaces.Box) and len(self.shape) == 3


def _leaves(space: gym.Space, prefix: str = "") -> list[tuple[str, gym.Space]]:
    if isinstance(space, gym.spaces.Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in _leaves(sub, f"{prefix}{key}/")]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces) for leaf in _leaves(sub, f"{prefix}{i}/")]
    return [(prefix.rstrip("/") or "obs", space)]


def _stored(space: gym.Space) -> tuple[tuple[int, ...], np.dtype]:
    if isinstance(space, gym.spaces.Box):
        return tuple(space.shape), np.dtype(np.uint8 if space.dtype == np.uint8 else np.float32)
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    if isinstance(space, gym.spaces.MultiBinary):
        return tuple(np.atleast_1d(space.n)), np.dtype(np.float32)
    raise ValueError(f"unsupported observation space {space}: expected Box, Discrete or MultiBinary leaves "
                     f"(inside Dict/Tuple spaces)")


def is_structured(space: gym.Space) -> bool:
    return isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))


class PackedObs:
    """Byte layout of a structured observation; packs on the env side, unpacks on the model side."""

    def __init__(self, space: gym.Space):
        self.fields: list[ObsField] = []
        offset = 0
        for key, leaf in _leaves(space):
            shape, dtype = _stored(leaf)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            self.fields.append(ObsField(key, leaf, shape, dtype, offset, nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        self.nbytes = offset
        self._float_fields = [f for f in self.fields if f.dtype.kind == "f"]
        # (field, torch dtype) resolved once: unpack runs on every inference batch
        self._torch_fields = [(f, torch.from_numpy(np.empty(0, dtype=f.dtype)).dtype) for f in self.fields]

    def pack_into(self, obs: Any, out: np.ndarray) -> None:
        """Write one observation (nested dicts/tuples of arrays) into a uint8 row of `nbytes`."""
        for field in self.fields:
            value = np.asarray(_lookup(obs, field.key), dtype=field.dtype)
            out[field.offset:field.offset + field.nbytes] = value.reshape(-1).view(np.uint8)

    def pack_batch_into(self, obs: Any, out: np.ndarray) -> None:
        """Write a batch of observations (nested dicts/tuples of arrays with the batch first) into `out`, a
        [batch, nbytes] uint8 array: one copy per field."""
        batch = out.shape[0]
        for field in self.fields:
            value = np.ascontiguousarray(_lookup(obs, field.key), dtype=field.dtype)
            out[:, field.offset:field.offset + field.nbytes] = value.reshape(batch, -1).view(np.uint8)

    def is_finite(self, row: np.ndarray) -> bool:
        return all(np.isfinite(row[..., f.offset:f.offset + f.nbytes].view(f.dtype)).all() for f in self._float_fields)

    def unpack(self, packed: torch.Tensor) -> dict[str, torch.Tensor]:
        """[B, nbytes] uint8 -> {key: [B, *shape]} views of the same memory."""
        batch = packed.shape[0]
        out = {}
        for field, dtype in self._torch_fields:
            raw = packed[:, field.offset:field.offset + field.nbytes]
            out[field.key] = (raw if dtype == torch.uint8 else raw.view(dtype)).reshape(batch, *field.shape)
        return out


def _lookup(obs: Any, key: str) -> Any:
    if key == "obs" and not isinstance(obs, (dict, tuple, list)):
        return obs
    for part in key.split("/"):
        obs = obs[int(part)] if isinstance(obs, (tuple, list)) else obs[part]
    return obs


def obs_storage(space: gym.Space) -> tuple[tuple[int, ...], torch.dtype]:
    """Per-step shape and dtype of the observation buffers."""
    if is_structured(space):
        return (PackedObs(space).nbytes,), torch.uint8
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"unsupported observation space {space}: expected a Box, Dict or Tuple")
    return tuple(space.shape), torch.uint8 if space.dtype == np.uint8 else torch.float32


class ObsWriter:
    """What an env runner uses to put an env's observation into a buffer row."""

    def __init__(self, space: gym.Space):
        self.packed = PackedObs(space) if is_structured(space) else None
        self.check_finite = self.packed is not None or obs_storage(space)[1].is_floating_point

    def write(self, obs: Any, out: np.ndarray) -> None:
        if self.packed is None:
            out[...] = obs
        else:
            self.packed.pack_into(obs, out)

    def write_batch(self, obs: Any, out: np.ndarray) -> None:
        """A vector env's batched observation into rows `out` (one array assignment for a Box)."""
        if self.packed is None:
            if np.shape(obs) != out.shape:  # what broadcasting would hide: a batch of the wrong size
                raise ValueError(f"a batch of observations of shape {np.shape(obs)}, not {out.shape}")
            out[...] = obs
        else:
            self.packed.pack_batch_into(obs, out)

    def is_finite(self, row: np.ndarray) -> bool:
        if not self.check_finite:
            return True
        return self.packed.is_finite(row) if self.packed is not None else bool(np.isfinite(row).all())
