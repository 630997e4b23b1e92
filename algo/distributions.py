"""Action distributions for Discrete, MultiDiscrete and Box spaces, behind one interface.

Actions are stored in trajectory buffers as one tensor per sample: int64 [n] for Discrete,
int64 [n, k] for MultiDiscrete, float32 [n, d] for Box (unclipped: the log-prob must match).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn


HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class ActionHead(nn.Module):
    """Maps features to distribution parameters (a linear layer, then `from_linear`); builds
    distributions from them."""

    num_params: int

    def from_linear(self, linear_out: torch.Tensor) -> torch.Tensor:
        """Distribution parameters from the linear layer's output (the model may compute that layer
        together with the value head)."""
        return linear_out

    def distribution(self, params: torch.Tensor) -> "ActionDistribution":
        raise NotImplementedError


class ActionDistribution:
    def sample(self) -> torch.Tensor: ...
    def mode(self) -> torch.Tensor: ...
    def log_prob(self, actions: torch.Tensor) -> torch.Tensor: ...
    def entropy(self) -> torch.Tensor: ...

    def kl_from(self, other: "ActionDistribution") -> torch.Tensor:
        """KL(other ‖ self) per sample: how much `self` loses where `other` puts its mass (a teacher's)."""
        ...


class CategoricalDist(ActionDistribution):
    """Several independent categoricals (one for Discrete); log-probs and entropies sum.

    Written on log-softmax directly rather than torch.distributions.Categorical: the inference
    worker samples a few dozen envs at a time, where Categorical's argument checks and lazy
    properties cost more than the math (measured in docs/performance.md).
    """

    def __init__(self, logits: torch.Tensor, sizes: list[int], squeeze: bool):
        chunks = [logits] if len(sizes) == 1 else torch.split(logits, sizes, dim=-1)
        self.log_probs = [torch.log_softmax(chunk, dim=-1) for chunk in chunks]
        self.squeeze = squeeze

    def _pack(self, parts: list[torch.Tensor]) -> torch.Tensor:
        return parts[0] if self.squeeze else torch.stack(parts, dim=-1)

    def sample(self) -> torch.Tensor:
        # Gumbel-max: argmax(log p + Gumbel noise) is an exact sample, and for small batches about
        # twice as fast as torch.multinomial
        return self._pack([(lp - torch.empty_like(lp).exponential_().log()).argmax(-1) for lp in self.log_probs])

    def mode(self) -> torch.Tensor:
        return self._pack([lp.argmax(-1) for lp in self.log_probs])

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        if self.squeeze:
            return self.log_probs[0].gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        return sum(lp.gather(-1, actions[..., i].long().unsqueeze(-1)).squeeze(-1)
                   for i, lp in enumerate(self.log_probs))

    def entropy(self) -> torch.Tensor:
        return sum(-(lp.exp() * lp).sum(-1) for lp in self.log_probs)

    def kl_from(self, other: ActionDistribution) -> torch.Tensor:
        assert isinstance(other, CategoricalDist)
        return sum((q.exp() * (q - p)).sum(-1) for p, q in zip(self.log_probs, other.log_probs))


class GaussianDist(ActionDistribution):
    """Independent normals with a state-independent log std, written out rather than torch.distributions.Normal:
    Normal spreads the std over every sample before its log, and its construction and checks cost more than
    the math in the learner's SGD steps on small models. The entropy depends on the log std alone."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean, self.log_std = mean, log_std

    def sample(self) -> torch.Tensor:
        with torch.no_grad():
            return torch.randn_like(self.mean).mul_(self.log_std.exp()).add_(self.mean)

    def mode(self) -> torch.Tensor:
        return self.mean

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) * (-self.log_std).exp()
        return -0.5 * z.pow(2).sum(-1) - (self.log_std.sum() + self.log_std.numel() * HALF_LOG_2PI)

    def entropy(self) -> torch.Tensor:
        return (self.log_std.sum() + self.log_std.numel() * (0.5 + HALF_LOG_2PI)).expand(self.mean.shape[:-1])

    def kl_from(self, other: ActionDistribution) -> torch.Tensor:
        assert isinstance(other, GaussianDist)
        var_ratio = (2 * (other.log_std - self.log_std)).exp()
        mean_term = ((other.mean - self.mean) * (-self.log_std).exp()).pow(2)
        return 0.5 * (var_ratio + mean_term - 1.0).sum(-1) + (self.log_std - other.log_std).sum()


class CategoricalHead(ActionHead):
    def __init__(self, in_features: int, sizes: list[int], squeeze: bool):
        super().__init__()
        self.sizes, self.squeeze = sizes, squeeze
        self.num_params = sum(sizes)
        self.linear = nn.Linear(in_features, self.num_params)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features)

    def distribution(self, params: torch.Tensor) -> ActionDistribution:
        return CategoricalDist(params, self.sizes, self.squeeze)


class GaussianHead(ActionHead):
    """State-independent log std, as is standard for PPO on continuous control."""

    def __init__(self, in_features: int, dim: int, tanh_scale: float, initial_log_std: float):
        super().__init__()
        self.num_params = dim
        self.tanh_scale = tanh_scale
        self.mean = nn.Linear(in_features, dim)
        self.log_std = nn.Parameter(torch.full((dim,), float(initial_log_std)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.from_linear(self.mean(features))

    def from_linear(self, mean: torch.Tensor) -> torch.Tensor:
        return torch.tanh(mean) * self.tanh_scale if self.tanh_scale > 0 else mean

    def distribution(self, params: torch.Tensor) -> ActionDistribution:
        return GaussianDist(params, self.log_std)


def make_action_head(space: gym.Space, in_features: int, tanh_scale: float, initial_log_std: float) -> ActionHead:
    if isinstance(space, gym.spaces.Discrete):
        return CategoricalHead(in_features, [int(space.n)], squeeze=True)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return CategoricalHead(in_features, [int(n) for n in np.ravel(space.nvec)], squeeze=False)
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return GaussianHead(in_features, int(space.shape[0]), tanh_scale, initial_log_std)
    raise ValueError(f"unsupported action space {space}: expected Discrete, MultiDiscrete or 1-D Box")


def action_storage(space: gym.Space) -> tuple[tuple[int, ...], torch.dtype]:
    """Per-sample shape and dtype of an action in trajectory buffers."""
    if isinstance(space, gym.spaces.Discrete):
        return (), torch.int64
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (int(np.prod(space.nvec.shape)),), torch.int64
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return (int(space.shape[0]),), torch.float32
    raise ValueError(f"unsupported action space {space}: expected Discrete, MultiDiscrete or 1-D Box")
