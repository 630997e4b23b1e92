"""Actor-critic model: (normalized) observations -> encoder -> action distribution and value.

Values are predicted in units normalized by running return statistics when `normalize_returns`
is on; `value()` always returns them in reward units.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from algo.distributions import ActionDistribution, make_action_head
from algo.normalization import RunningMeanStd

ACTIVATIONS = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh}


@dataclass(frozen=True)
class ModelSpec:
    """The model-related flags, so the model does not depend on the whole config."""

    encoder_mlp_layers: tuple[int, ...] = (512, 512)
    nonlinearity: str = "elu"
    share_weights: bool = True
    normalize_input: bool = True
    normalize_returns: bool = True
    continuous_tanh_scale: float = 0.0
    initial_log_std: float = 0.0

    @classmethod
    def from_config(cls, cfg) -> "ModelSpec":
        return cls(tuple(cfg.encoder_mlp_layers), cfg.nonlinearity, cfg.actor_critic_share_weights,
                   cfg.normalize_input, cfg.normalize_returns, cfg.continuous_tanh_scale, cfg.initial_log_std)


def mlp(in_features: int, layers: tuple[int, ...], activation: str) -> nn.Sequential:
    modules: list[nn.Module] = []
    for size in layers:
        modules += [nn.Linear(in_features, size), ACTIVATIONS[activation]()]
        in_features = size
    return nn.Sequential(*modules)


def observation_size(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise ValueError(f"unsupported observation space {space}: the MLP encoder needs a Box")


class ActorCritic(nn.Module):
    def __init__(self, obs_space: gym.Space, action_space: gym.Space, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        obs_dim = observation_size(obs_space)
        self.obs_norm = RunningMeanStd((obs_dim,)) if spec.normalize_input else None
        self.returns_norm = RunningMeanStd((), clip=1e6) if spec.normalize_returns else None

        self.actor_encoder = mlp(obs_dim, spec.encoder_mlp_layers, spec.nonlinearity)
        self.critic_encoder = None if spec.share_weights else mlp(obs_dim, spec.encoder_mlp_layers, spec.nonlinearity)
        features = spec.encoder_mlp_layers[-1] if spec.encoder_mlp_layers else obs_dim
        self.action_head = make_action_head(action_space, features, spec.continuous_tanh_scale, spec.initial_log_std)
        self.value_head = nn.Linear(features, 1)
        self._init_weights()

    def _init_weights(self) -> None:
        # Orthogonal init with small policy/value output gains: the standard PPO recipe.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight, gain=np.sqrt(2))
                nn.init.zeros_(module.bias)
        for linear, gain in ((self._policy_linear(), 0.01), (self.value_head, 1.0)):
            nn.init.orthogonal_(linear.weight, gain=gain)

    def _policy_linear(self) -> nn.Linear:
        head = self.action_head
        return head.mean if hasattr(head, "mean") else head.linear

    def _prepare(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.reshape(obs.shape[0], -1).float()
        return self.obs_norm.normalize(obs) if self.obs_norm is not None else obs

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (action-distribution parameters, value in normalized units)."""
        x = self._prepare(obs)
        actor_features = self.actor_encoder(x)
        critic_features = actor_features if self.critic_encoder is None else self.critic_encoder(x)
        return self.action_head(actor_features), self.value_head(critic_features).squeeze(-1)

    def distribution(self, params: torch.Tensor) -> ActionDistribution:
        return self.action_head.distribution(params)

    def denormalize_value(self, value: torch.Tensor) -> torch.Tensor:
        return self.returns_norm.denormalize(value) if self.returns_norm is not None else value

    def normalize_value(self, value: torch.Tensor) -> torch.Tensor:
        if self.returns_norm is None:
            return value
        mean, std = self.returns_norm._mean_std(value.dtype)
        return (value - mean) / std  # unclipped, unlike observations
