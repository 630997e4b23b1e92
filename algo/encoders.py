"""Observations -> features: preprocessing (unpacking, scaling, normalisation) and the encoders.

`ObsPreprocessor` turns the stored observation tensor into one float tensor per field (see
`sf_core.algo.observations`): images channels first, uint8 images scaled by 1/255 and never normalized by
running statistics (per-pixel statistics would make static background pixels explode), float images
normalized by one scalar mean/std, vectors by per-element running statistics (`--normalize_input`),
Discrete fields one-hot. It is shared by the actor's and the critic's encoders.

`ObservationEncoder` gives every image field a conv encoder (`sf_core.algo.conv_encoders`: the trunk that
`--encoder_conv_architecture` picks for the image's size, then the `--encoder_conv_mlp_layers`),
concatenates all other fields into one MLP (`--encoder_mlp_layers`), and concatenates the results.
A Box observation is the one-field case.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from sf_core.algo.conv_encoders import ConvEncoder
from sf_core.algo.mlp import mlp
from sf_core.algo.normalization import Gather, RunningMeanStd
from sf_core.algo.observations import ObsField, PackedObs, is_structured


def image_layout(shape: tuple[int, ...]) -> tuple[tuple[int, int, int], bool]:
    """((C, H, W), channels_last) for a 3-dim observation shape."""
    a, b, c = shape
    if c <= 4 < a:
        return (c, a, b), True
    return (a, b, c), False


def _module_key(key: str) -> str:
    return key.replace("/", "__")  # ModuleDict keys may not contain dots; keep them readable


class ObsPreprocessor(nn.Module):
    """Stored observation tensor -> {field key: float tensor ready for an encoder}."""

    def __init__(self, space: gym.Space, normalize_input: bool):
        super().__init__()
        self.packed = PackedObs(space) if is_structured(space) else None
        if self.packed is not None:
            self.fields = self.packed.fields
        else:
            self.fields = [ObsField("obs", space, tuple(space.shape), np.dtype(space.dtype), 0, 0)]
        self.layouts = {f.key: image_layout(f.shape) for f in self.fields if f.is_image}
        norms = {}
        for f in self.fields:
            if not normalize_input or isinstance(f.space, gym.spaces.Discrete) or f.dtype == np.uint8:
                continue  # one-hot, or uint8 images with their fixed 1/255 scale
            norms[_module_key(f.key)] = RunningMeanStd(() if f.is_image else (int(np.prod(f.shape)),))
        self.norms = nn.ModuleDict(norms)
        # per field: (key, field, its normalizer or None), resolved once: this runs on every
        # inference call, where dictionary lookups and type checks add up
        self._plan = [(f.key, f, norms.get(_module_key(f.key))) for f in self.fields]

    def widths(self) -> dict[str, int | tuple[int, int, int]]:
        """Per field: (C, H, W) for images, the feature count for everything else."""
        out: dict[str, int | tuple[int, int, int]] = {}
        for f in self.fields:
            if f.is_image:
                out[f.key] = self.layouts[f.key][0]
            elif isinstance(f.space, gym.spaces.Discrete):
                out[f.key] = int(f.space.n)
            else:
                out[f.key] = int(np.prod(f.shape))
        return out

    def _raw(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.packed.unpack(obs) if self.packed is not None else {"obs": obs}

    def _unnormalized(self, key: str, field: ObsField, x: torch.Tensor) -> torch.Tensor:
        if field.is_image:
            if self.layouts[key][1]:
                x = x.permute(0, 3, 1, 2)
            if torch.is_grad_enabled() and x.device.type == "cpu":
                # channels_last for training on the CPU: oneDNN's weight gradient of the first conv (4
                # input channels, stride 4) is 2× faster from it, and the whole Nature-CNN SGD step
                # 24 % (docs/performance.md); in inference (no grad) the conversion costs more than it gains
                x = torch.empty(x.shape, device=x.device, memory_format=torch.channels_last).copy_(x)
            else:
                x = x.float()
            # in place: the float copy is new, and a second full-size temporary costs as much as the conversion
            return x.mul_(1.0 / 255.0) if field.dtype == np.uint8 else x
        if isinstance(field.space, gym.spaces.Discrete):
            return nn.functional.one_hot(x.long() - int(field.space.start), int(field.space.n)).float()
        return x.reshape(x.shape[0], -1).float()

    def prepare(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """A plain method, not forward(): nothing here is learned, and nn.Module's call machinery costs
        more than the work for a small batch."""
        if self.packed is None and not self.layouts:  # one Box of features: the per-call fast path
            x = obs.reshape(obs.shape[0], -1).float()
            norm = self._plan[0][2]
            return {"obs": norm.normalize(x) if norm is not None else x}
        return self.prepare_fields(self._raw(obs))

    def prepare_fields(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The same from the fields already unpacked ({key: [B, *shape]} in their stored dtypes): an
        exported model takes one input per field, since ONNX has no reinterpreting view of bytes."""
        out = {}
        for key, field, norm in self._plan:
            x = self._unnormalized(key, field, raw[key])
            out[key] = norm.normalize(x) if norm is not None else x
        return out

    @torch.no_grad()
    def update(self, obs: torch.Tensor, gather: Gather | None = None) -> None:
        """Fold a batch of stored observations into the running statistics (`gather`: see RunningMeanStd)."""
        if not len(self.norms):
            return
        raw = self._raw(obs)
        for key, field, norm in self._plan:
            if norm is not None:
                norm.update(self._unnormalized(key, field, raw[key]), gather)


class ObservationEncoder(nn.Module):
    """A conv trunk per image field, one MLP over all other fields, outputs concatenated."""

    def __init__(self, widths: dict[str, int | tuple[int, int, int]], spec):
        super().__init__()
        self.image_keys = [k for k, w in widths.items() if isinstance(w, tuple)]
        self.vector_keys = [k for k, w in widths.items() if not isinstance(w, tuple)]
        self.convs = nn.ModuleDict()
        self.out_features = 0
        for key in self.image_keys:
            conv = ConvEncoder(key, widths[key], spec)
            self.convs[_module_key(key)] = conv
            self.out_features += conv.out_features
        self.mlp = None
        if self.vector_keys:
            size = sum(widths[k] for k in self.vector_keys)
            self.mlp = mlp(size, spec.encoder_mlp_layers, spec.nonlinearity)
            self.out_features += spec.encoder_mlp_layers[-1] if spec.encoder_mlp_layers else size
        self.single_vector = not self.image_keys and len(self.vector_keys) == 1

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.single_vector:  # the common case (one Box of features), kept cheap for inference
            return self.mlp(inputs[self.vector_keys[0]])
        parts = [self.convs[_module_key(k)](inputs[k]) for k in self.image_keys]
        if self.mlp is not None:
            vectors = [inputs[k] for k in self.vector_keys]
            parts.append(self.mlp(vectors[0] if len(vectors) == 1 else torch.cat(vectors, dim=1)))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
