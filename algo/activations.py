"""The nonlinearities `--nonlinearity` picks from.

ELU is our own on the CPU: torch's CPU kernel computes expm1 element by element, several times the
cost of a ReLU, and ELU was a visible share of the 512×512 MLP's SGD step. Written as
exp(min(x, 0)) - 1 with vectorized ops (exp is as cheap as a ReLU) and with a backward pass from the
output (d elu / dx = y + 1 where x <= 0), it is faster both ways (docs/performance.md, "ELU").
exp(x) - 1 differs from expm1 by at most ~6e-8 near zero, far below what training notices. Below
8,192 elements (a 64-env inference batch of a 64-wide layer is 4,096) the fixed cost of four ops
loses to torch's one, and on other devices torch's kernel is fused anyway: both use torch's own.

tanh likewise: torch's CPU kernel costs several times a sigmoid (8-11 % of Ant's and Humanoid's training
iteration in torch.profiler), so it is written as 2 sigmoid(2x) - 1 (within ~2e-7 of torch's, against its ~3e-8
from the exact value) with a backward from the output, 1 - y^2. The autograd.Function's own cost outweighs
the gain on small tensors: in training from 32,768 elements (a 256-sample minibatch of a 128-wide layer), in
inference from 8,192 (docs/performance.md, "tanh").
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


_MIN_ELEMENTS = 8192
_MIN_TANH_TRAINING_ELEMENTS = 32768


class _FromOutput(torch.autograd.Function):
    """An activation written with vectorized ops, its backward computed from its output (the tensor kept)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, activation: Callable, backward_from_output: Callable) -> torch.Tensor:
        y = activation(x)
        ctx.backward_from_output = backward_from_output
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (y,) = ctx.saved_tensors
        return ctx.backward_from_output(grad, y), None, None


def _elu(x: torch.Tensor) -> torch.Tensor:
    negative = x.clamp(max=0).exp_().sub_(1)  # one temporary, reused for the result
    return torch.maximum(x, negative, out=negative)  # exp(x) - 1 >= x, with equality only at 0


def _elu_backward(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.elu_backward(grad, 1.0, 1, 1, True, y)  # is_result: the gradient from y


class ELU(nn.Module):
    """ELU with alpha 1 (as nn.ELU()), faster on the CPU; see the module docstring."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.numel() < _MIN_ELEMENTS:
            return nn.functional.elu(x)
        if x.requires_grad and torch.is_grad_enabled():
            return _FromOutput.apply(x, _elu, _elu_backward)
        return _elu(x)


def _tanh(x: torch.Tensor) -> torch.Tensor:
    y = torch.mul(x, 2.0)  # one temporary, reused for the result
    return torch.sigmoid_(y).mul_(2.0).sub_(1.0)


class Tanh(nn.Module):
    """tanh (as nn.Tanh()), faster on the CPU; see the module docstring."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # bfloat16: 2 sigmoid(2x) - 1 rounded at each op would lose what torch's one rounding keeps near 0;
        # a TorchScript trace (export) records one op, for any batch size
        if torch.jit.is_tracing() or x.device.type != "cpu" or x.dtype != torch.float32 or x.numel() < _MIN_ELEMENTS:
            return torch.tanh(x)
        if not (x.requires_grad and torch.is_grad_enabled()):
            return _tanh(x)
        if x.numel() < _MIN_TANH_TRAINING_ELEMENTS:
            return torch.tanh(x)
        return _FromOutput.apply(x, _tanh, torch.ops.aten.tanh_backward)


ACTIVATIONS: dict[str, type[nn.Module]] = {"elu": ELU, "relu": nn.ReLU, "tanh": Tanh}
