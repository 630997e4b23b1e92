"""Clipping gradients by their global norm, as torch.nn.utils.clip_grad_norm_ does.

The learner clips at every SGD step. torch's function groups the gradients by device and dtype at every call,
and on the small models of continuous control that bookkeeping cost more than the norms themselves; a model's
gradients here share one device and dtype, checked once per call, and torch's function serves the rest."""

from __future__ import annotations

import math

import torch


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scales the gradients so their global L2 norm is at most `max_norm` (inf: leaves them alone) and returns
    the norm they had, which is not finite if any gradient is not."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    first = grads[0]
    if any(g.device != first.device or g.dtype != first.dtype or g.is_sparse for g in grads):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if math.isfinite(max_norm):
        torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total
