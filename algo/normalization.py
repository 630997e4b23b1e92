"""Running mean/std kept as module buffers, so they travel with the weights."""

from __future__ import annotations

import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Parallel-algorithm running moments (Chan et al.) over the leading dim of each update."""

    def __init__(self, shape: tuple[int, ...], clip: float = 5.0, eps: float = 1e-5):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(eps, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, *self.mean.shape).double()
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        m2 = self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        std = (self.var + self.eps).sqrt().to(x.dtype)
        return ((x - self.mean.to(x.dtype)) / std).clamp(-self.clip, self.clip)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        std = (self.var + self.eps).sqrt().to(x.dtype)
        return x * std + self.mean.to(x.dtype)
