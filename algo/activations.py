"""The nonlinearities `--nonlinearity` picks from.

ELU is our own on the CPU: torch's CPU kernel computes expm1 element by element, several times the
cost of a ReLU, and ELU was a visible share of the 512×512 MLP's SGD step. Written as
exp(min(x, 0)) - 1 with vectorized ops (exp is as cheap as a ReLU) and with a backward pass from the
output (d elu / dx = y + 1 where x <= 0), it is faster both ways (docs/performance.md, "ELU").
exp(x) - 1 differs from expm1 by at most ~6e-8 near zero, far below what training notices. Below
8,192 elements (a 64-env inference batch of a 64-wide layer is 4,096) the fixed cost of four ops
loses to torch's one, and on other devices torch's kernel is fused anyway: both use torch's own.
"""

from __future__ import annotations

import torch
from torch import nn


_MIN_ELEMENTS = 8192


def _elu(x: torch.Tensor) -> torch.Tensor:
    negative = x.clamp(max=0).exp_().sub_(1)  # one temporary, reused for the result
    return torch.maximum(x, negative, out=negative)  # exp(x) - 1 >= x, with equality only at 0


class _ELUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = _elu(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.elu_backward(grad, 1.0, 1, 1, True, y)  # is_result: the gradient from y


class ELU(nn.Module):
    """ELU with alpha 1 (as nn.ELU()), faster on the CPU; see the module docstring."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.numel() < _MIN_ELEMENTS:
            return nn.functional.elu(x)
        if x.requires_grad and torch.is_grad_enabled():
            return _ELUFunction.apply(x)
        return _elu(x)


ACTIVATIONS: dict[str, type[nn.Module]] = {"elu": ELU, "relu": nn.ReLU, "tanh": nn.Tanh}
