"""RND's three networks (algo/rnd.py): the fixed random target, the trained predictor and the intrinsic critic,
for flat observations (MLPs) and for images (a conv trunk on the newest frame).

What the networks see, as in Burda et al. (2018): observations whitened by running statistics and clipped to
[-5, 5]. A flat Box is whitened per element. An image (a Box of 3 dims, e.g. Atari's stack of 4 frames of
84×84) is reduced to its last channel, the newest frame, as the paper does, and whitened per pixel: RND's
novelty is about where the agent is now, and per-pixel statistics make a static background whiten to 0 while
what moves stands out. The conv trunk is the one `--encoder_conv_architecture=auto` picks for that frame (the
Nature CNN where it fits, the small padded CNN below 36×36 pixels); the paper's target is that CNN with one
linear layer on top, its predictor the same with two more, which is what is built here.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from sf_core.algo.conv_encoders import conv_trunk
from sf_core.algo.encoders import image_layout
from sf_core.algo.mlp import mlp
from sf_core.algo.normalization import Gather, RunningMeanStd
from sf_core.config import ConfigError

OBS_CLIP = 5.0  # whitened observations are clipped to [-5, 5], as in the paper


@dataclass(frozen=True)
class RNDInput:
    """What RND reads of a stored observation: a flat vector of `size`, or the newest frame (the last
    channel) of an image of `chw`, stored channels-last where `channels_last`."""

    size: int = 0
    chw: tuple[int, int, int] | None = None
    channels_last: bool = False

    @classmethod
    def of(cls, space: gym.Space) -> "RNDInput":
        """From the env's observation space; a clear error for any space RND cannot read (the runner asks
        before any process starts: `Algorithm.check_spaces`)."""
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            return cls(size=int(space.shape[0]))
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 3:
            chw, channels_last = image_layout(tuple(space.shape))
            return cls(chw=chw, channels_last=channels_last)
        raise ConfigError(f"--algo=APPO_RND supports Box observations of 1 dim (features) or 3 (an image); "
                          f"this env's observation space is {space}")

    @property
    def stats_shape(self) -> tuple[int, ...]:
        """The shape whitened: the features, or one frame of H×W pixels."""
        return (self.size,) if self.chw is None else (1, *self.chw[1:])

    def read(self, obs: torch.Tensor) -> torch.Tensor:
        """Stored observations [*, ...] -> what is whitened, as floats: [*, size] or the newest frame [*, 1, H, W]."""
        if self.chw is None:
            return obs.float()
        frame = obs[..., -1] if self.channels_last else obs[..., -1, :, :]
        return frame.unsqueeze(-3).float()


def init_orthogonal(module: nn.Module) -> nn.Module:
    """Orthogonal init with gain √2, zero biases (CleanRL's): a random target so initialised spreads
    different inputs far apart, which is what makes its embedding informative."""
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(layer.weight, gain=np.sqrt(2))
            nn.init.zeros_(layer.bias)
    return module


def dense(in_features: int, hidden: int, out_features: int, hidden_layers: int) -> list[nn.Module]:
    """`hidden_layers` ReLU layers of `hidden` units, then a linear output layer."""
    last = hidden if hidden_layers else in_features
    return [*mlp(in_features, (hidden,) * hidden_layers, "relu"), nn.Linear(last, out_features)]


def rnd_network(inp: RNDInput, hidden: int, out_features: int, image_dense_layers: int = 0) -> nn.Module:
    """Whitened input -> [*, out_features], leading dims kept: for flat input an MLP of two hidden ReLU layers
    (its layout that of the checkpoints written before images were read), for a frame `ImageNetwork`."""
    if inp.chw is None:
        return init_orthogonal(nn.Sequential(*dense(inp.size, hidden, out_features, 2)))
    return init_orthogonal(ImageNetwork(inp.chw, hidden, out_features, image_dense_layers))


class ImageNetwork(nn.Module):
    """The conv trunk `--encoder_conv_architecture=auto` picks for one frame, then `dense_layers` ReLU layers
    and a linear output; [*, 1, H, W] -> [*, out_features]."""

    def __init__(self, chw: tuple[int, int, int], hidden: int, out_features: int, dense_layers: int):
        super().__init__()
        frame = (1, *chw[1:])
        self.trunk = conv_trunk("auto", frame, "relu", "obs")[1]  # ends activated and flattened
        with torch.no_grad():
            flat = int(self.trunk(torch.zeros(1, *frame)).shape[1])
        self.head = nn.Sequential(*dense(flat, hidden, out_features, dense_layers))

    def forward(self, whitened: torch.Tensor) -> torch.Tensor:
        lead = whitened.shape[:-3]
        features = self.trunk(whitened.reshape(-1, *whitened.shape[-3:]))
        return self.head(features).reshape(*lead, -1)


class RNDTarget(nn.Module):
    """The fixed random network. It holds no statistics (they live in the predictor), so it never changes
    and may wait off its device between calls (--offload_models)."""

    def __init__(self, inp: RNDInput, hidden: int):
        super().__init__()
        self.net = rnd_network(inp, hidden, hidden)
        self.requires_grad_(False)

    def forward(self, whitened_obs: torch.Tensor) -> torch.Tensor:
        return self.net(whitened_obs)


class Whitening(nn.Module):
    """What the predictor and the intrinsic critic share: the input they read (`RNDInput`) and its running
    statistics, which whiten it."""

    def __init__(self, inp: RNDInput):
        super().__init__()
        self.inp = inp
        self.obs_norm = RunningMeanStd(inp.stats_shape, clip=OBS_CLIP)

    def whiten(self, obs: torch.Tensor) -> torch.Tensor:
        return self.obs_norm.normalize(self.inp.read(obs))

    def update_obs_stats(self, obs: torch.Tensor, gather: Gather | None = None) -> None:
        self.obs_norm.update(self.inp.read(obs), gather)


class RNDPredictor(Whitening):
    """The trained network, and the two running statistics RND needs (buffers: checkpoints carry them):
    the observations' mean/std, for whitening what both networks see, and the std of the discounted
    intrinsic return, which the prediction errors are divided by."""

    def __init__(self, inp: RNDInput, hidden: int):
        super().__init__(inp)
        self.net = rnd_network(inp, hidden, hidden, image_dense_layers=2)
        self.return_norm = RunningMeanStd(())

    def reward_scale(self) -> torch.Tensor:
        return (self.return_norm.var + self.return_norm.eps).sqrt().float()

    def forward(self, whitened_obs: torch.Tensor) -> torch.Tensor:
        return self.net(whitened_obs)


class IntrinsicCritic(Whitening):
    """V_int(s), the value of the intrinsic returns, on observations whitened by its own running statistics.
    The actor-critic's value head stays the extrinsic critic: the two returns have different discounts and
    one of them never stops at an episode end."""

    def __init__(self, inp: RNDInput, hidden: int):
        super().__init__(inp)
        self.net = rnd_network(inp, hidden, 1, image_dense_layers=1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.whiten(obs)).squeeze(-1)
