"""Actor-critic model: (normalized) observations -> encoder -> action distribution and value.

Values are predicted in units normalized by running return statistics when `normalize_returns`
is on; `value()` always returns them in reward units.

Encoders: a Box observation with 3 dims is an image and gets a conv encoder (`--encoder_conv_architecture`:
`convnet_atari`, the Nature-DQN CNN, or `resnet_impala`, the IMPALA ResNet) followed by the
`--encoder_conv_mlp_layers` fully connected layers; any other Box is flattened into the MLP encoder
(`--encoder_mlp_layers`). Images are channels first `[C, H, W]`; `[H, W, C]` with C <= 4 < H is
recognised and transposed. uint8 images are scaled by 1/255 and never normalized by running statistics
(per-pixel statistics would make static background pixels explode); float images, with
`--normalize_input`, are normalized by one scalar mean/std over all their elements.
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
    encoder_conv_architecture: str = "convnet_atari"
    encoder_conv_mlp_layers: tuple[int, ...] = (512,)

    @classmethod
    def from_config(cls, cfg) -> "ModelSpec":
        return cls(tuple(cfg.encoder_mlp_layers), cfg.nonlinearity, cfg.actor_critic_share_weights,
                   cfg.normalize_input, cfg.normalize_returns, cfg.continuous_tanh_scale, cfg.initial_log_std,
                   cfg.encoder_conv_architecture, tuple(cfg.encoder_conv_mlp_layers))


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


def is_image_space(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3


def image_layout(shape: tuple[int, ...]) -> tuple[tuple[int, int, int], bool]:
    """((C, H, W), channels_last) for a 3-dim observation shape."""
    a, b, c = shape
    if c <= 4 < a:
        return (c, a, b), True
    return (a, b, c), False


class NatureCNN(nn.Sequential):
    """Mnih et al. 2015: conv 32 8×8/4, 64 4×4/2, 64 3×3/1 (84×84 input -> 64×7×7)."""

    def __init__(self, channels: int, activation: str):
        act = ACTIVATIONS[activation]
        super().__init__(nn.Conv2d(channels, 32, 8, stride=4), act(), nn.Conv2d(32, 64, 4, stride=2), act(),
                         nn.Conv2d(64, 64, 3, stride=1), act(), nn.Flatten())


class ResidualBlock(nn.Module):
    def __init__(self, channels: int, activation: str):
        super().__init__()
        act = ACTIVATIONS[activation]
        self.body = nn.Sequential(act(), nn.Conv2d(channels, channels, 3, padding=1), act(),
                                  nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ImpalaResNet(nn.Sequential):
    """Espeholt et al. 2018: three stages of (conv 3×3, max-pool 3×3/2, two residual blocks) with 16, 32
    and 32 channels (84×84 input -> 32×11×11)."""

    def __init__(self, channels: int, activation: str, stages: tuple[int, ...] = (16, 32, 32)):
        layers: list[nn.Module] = []
        for out in stages:
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       ResidualBlock(out, activation), ResidualBlock(out, activation)]
            channels = out
        layers += [ACTIVATIONS[activation](), nn.Flatten()]
        super().__init__(*layers)


CONV_ARCHITECTURES = {"convnet_atari": NatureCNN, "resnet_impala": ImpalaResNet}


def conv_encoder(chw: tuple[int, int, int], spec: "ModelSpec") -> tuple[nn.Module, int]:
    """The conv trunk plus its fully connected layers; returns (module, output features)."""
    if spec.encoder_conv_architecture not in CONV_ARCHITECTURES:
        raise ValueError(f"unknown encoder_conv_architecture {spec.encoder_conv_architecture!r}; "
                         f"known: {', '.join(CONV_ARCHITECTURES)}")
    trunk = CONV_ARCHITECTURES[spec.encoder_conv_architecture](chw[0], spec.nonlinearity)
    with torch.no_grad():
        flat = int(trunk(torch.zeros(1, *chw)).shape[1])
    head = mlp(flat, spec.encoder_conv_mlp_layers, spec.nonlinearity)
    features = spec.encoder_conv_mlp_layers[-1] if spec.encoder_conv_mlp_layers else flat
    return nn.Sequential(trunk, head), features


class ActorCritic(nn.Module):
    def __init__(self, obs_space: gym.Space, action_space: gym.Space, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.image = is_image_space(obs_space)
        if self.image:
            self.image_chw, self.channels_last = image_layout(tuple(obs_space.shape))
            self.uint8_image = obs_space.dtype == np.uint8
            # uint8: a fixed 1/255 scale. float: one scalar mean/std, never per pixel.
            norm_shape: tuple[int, ...] | None = None if self.uint8_image or not spec.normalize_input else ()
            self.actor_encoder, features = conv_encoder(self.image_chw, spec)
            self.critic_encoder = None if spec.share_weights else conv_encoder(self.image_chw, spec)[0]
        else:
            obs_dim = observation_size(obs_space)
            norm_shape = (obs_dim,) if spec.normalize_input else None
            self.actor_encoder = mlp(obs_dim, spec.encoder_mlp_layers, spec.nonlinearity)
            self.critic_encoder = None if spec.share_weights else mlp(obs_dim, spec.encoder_mlp_layers,
                                                                      spec.nonlinearity)
            features = spec.encoder_mlp_layers[-1] if spec.encoder_mlp_layers else obs_dim
        self.obs_norm = RunningMeanStd(norm_shape) if norm_shape is not None else None
        self.returns_norm = RunningMeanStd((), clip=1e6) if spec.normalize_returns else None
        self.action_head = make_action_head(action_space, features, spec.continuous_tanh_scale, spec.initial_log_std)
        self.value_head = nn.Linear(features, 1)
        self._init_weights()

    def _init_weights(self) -> None:
        # Orthogonal init with small policy/value output gains: the standard PPO recipe.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(module.weight, gain=np.sqrt(2))
                nn.init.zeros_(module.bias)
        for linear, gain in ((self._policy_linear(), 0.01), (self.value_head, 1.0)):
            nn.init.orthogonal_(linear.weight, gain=gain)

    def _policy_linear(self) -> nn.Linear:
        head = self.action_head
        return head.mean if hasattr(head, "mean") else head.linear

    def _prepare(self, obs: torch.Tensor) -> torch.Tensor:
        if self.image:
            if self.channels_last:
                obs = obs.permute(0, 3, 1, 2)
            if self.uint8_image:
                return obs.float() * (1.0 / 255.0)
            obs = obs.float()
            return self.obs_norm.normalize(obs) if self.obs_norm is not None else obs
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
