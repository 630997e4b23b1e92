"""The fully connected stacks of the model: encoder MLP, the layers after a conv trunk, the decoder."""

from __future__ import annotations

from torch import nn

from sf_core.algo.activations import ACTIVATIONS


def mlp(in_features: int, layers: tuple[int, ...], activation: str) -> nn.Sequential:
    """Linear + activation per size in `layers` (an empty tuple: the identity)."""
    modules: list[nn.Module] = []
    for size in layers:
        modules += [nn.Linear(in_features, size), ACTIVATIONS[activation]()]
        in_features = size
    return nn.Sequential(*modules)
