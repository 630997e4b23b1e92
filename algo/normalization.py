"""Running mean/std kept as module buffers, so they travel with the weights."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

# The same tensor from every learner of a group, in rank order (sf_core.algo.graph.Context.gather)
Gather = Callable[[torch.Tensor], list[torch.Tensor]]


class RunningMeanStd(nn.Module):
    """Parallel-algorithm running moments (Chan et al.) over the leading dim of each update."""

    def __init__(self, shape: tuple[int, ...], clip: float = 5.0, eps: float = 1e-5):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(eps, dtype=torch.float64))
        self._cache: tuple[torch.Tensor, torch.Tensor] | None = None  # float32 (mean, std) until stats change
        self.register_load_state_dict_post_hook(lambda module, keys: module._invalidate())

    def _invalidate(self) -> None:
        self._cache = None

    def _mean_std(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # Converting the float64 statistics on every call cost more than the normalisation itself.
        if self._cache is None or self._cache[0].dtype != dtype or self._cache[0].device != self.mean.device:
            self._cache = (self.mean.to(dtype), (self.var + self.eps).sqrt().to(dtype))
        return self._cache

    @torch.no_grad()
    def update(self, x: torch.Tensor, gather: Gather | None = None) -> None:
        """`gather`: a learner group, each rank holding a share of the batch. Every rank folds in every
        share's moments, in rank order, and so keeps the statistics one learner of the whole batch would."""
        x = x.reshape(-1, *self.mean.shape).double()
        if gather is None:
            if x.shape[0]:  # none: e.g. every sample of a dataset masked out for policy lag
                self._fold(x.mean(0), x.var(0, unbiased=False), x.shape[0])
            return
        n = x.shape[0]
        zero = torch.zeros_like(self.mean)
        moments = torch.stack([torch.full_like(self.mean, n), x.mean(0) if n else zero,
                               x.var(0, unbiased=False) if n else zero])
        for count, mean, var in gather(moments):
            if count.flatten()[0] > 0:
                self._fold(mean, var, int(count.flatten()[0]))

    def _fold(self, batch_mean: torch.Tensor, batch_var: torch.Tensor, n: int) -> None:
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        m2 = self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)
        self._invalidate()

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self._mean_std(x.dtype)
        return ((x - mean) / std).clamp(-self.clip, self.clip)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self._mean_std(x.dtype)
        return x * std + mean

    def _apply(self, fn, *args, **kwargs):  # .to(device) etc. must not keep a cache on the old device
        self._cache = None
        return super()._apply(fn, *args, **kwargs)


def forget_cached_statistics(model: nn.Module) -> None:
    """Drops every RunningMeanStd's cached float copies of its statistics. Before a CUDA graph records a model
    call, so that the graph converts the statistics itself on each replay (a cache made before would be read
    at its old address, stale once the statistics change); and after it, so that eager calls never read a
    tensor of the graph's memory pool."""
    for module in model.modules():
        if isinstance(module, RunningMeanStd):
            module._invalidate()
