"""Conv encoders for image fields, and which one an image gets (`--encoder_conv_architecture`).

  convnet_atari  the Nature-DQN CNN (Mnih et al. 2015): unpadded 8×8/4, 4×4/2, 3×3/1 convs, so it
                 needs images of at least 36×36
  resnet_impala  the IMPALA ResNet (Espeholt et al. 2018): padded convs and pools, any size
  convnet_small  three padded 3×3 convs (32, 64, 64 channels) whose strides follow the image: 2 along
                 a side while that side is at least 8 pixels, else 1; any size from 1×1 (grid worlds,
                 minimaps)
  auto           (the default) convnet_atari where it fits, convnet_small where it does not

`auto` keeps every image that the Nature CNN fits (84×84 frames, and anything from 36×36) on exactly
the Nature CNN, so command lines and checkpoints from before `auto` existed build the same model.
An architecture named explicitly is taken at its word: if it cannot fit the image, building the model
raises ValueError naming the image's shape and the flag, before any process starts.

Each image field's encoder is a `ConvEncoder`: the trunk, then the `--encoder_conv_mlp_layers`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from sf_core.algo.activations import ACTIVATIONS
from sf_core.algo.mlp import mlp

if TYPE_CHECKING:
    from sf_core.algo.model_spec import ModelSpec

AUTO = "auto"
SMALL_STRIDE_MIN_SIDE = 8  # a side this long or longer is halved by the next small-input conv


def _shape(values: tuple[int, ...]) -> str:
    return "×".join(str(v) for v in values)


def _convs(trunk: nn.Module) -> str:
    """'32 8×8/4, 64 4×4/1×2': each conv's channels, kernel and stride (one number where H and W share it)."""
    convs = [c for c in trunk.modules() if isinstance(c, nn.Conv2d)]
    strides = [str(c.stride[0]) if len(set(c.stride)) == 1 else _shape(c.stride) for c in convs]
    return ", ".join(f"{c.out_channels} {_shape(c.kernel_size)}/{stride}" for c, stride in zip(convs, strides))


class NatureCNN(nn.Sequential):
    """Mnih et al. 2015: conv 32 8×8/4, 64 4×4/2, 64 3×3/1 (84×84 input -> 64×7×7)."""

    def __init__(self, channels: int, activation: str):
        act = ACTIVATIONS[activation]
        super().__init__(nn.Conv2d(channels, 32, 8, stride=4), act(), nn.Conv2d(32, 64, 4, stride=2), act(),
                         nn.Conv2d(64, 64, 3, stride=1), act(), nn.Flatten())

    def describe(self) -> str:
        return f"conv {_convs(self)}"


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
        self.stages = stages

    def describe(self) -> str:
        channels = ", ".join(map(str, self.stages))
        return f"{len(self.stages)} stages of conv 3×3, max-pool 3×3/2, 2 residual blocks ({channels} channels)"


def small_input_strides(hw: tuple[int, int], layers: int = 3) -> list[tuple[int, int]]:
    """Per conv, per side: 2 while the side is at least SMALL_STRIDE_MIN_SIDE, else 1. Long sides
    shrink towards the Nature CNN's 7×7 output; short ones keep every pixel (a grid cell can matter)."""
    height, width = hw
    strides = []
    for _ in range(layers):
        step = (2 if height >= SMALL_STRIDE_MIN_SIDE else 1, 2 if width >= SMALL_STRIDE_MIN_SIDE else 1)
        strides.append(step)
        height, width = (height - 1) // step[0] + 1, (width - 1) // step[1] + 1  # a padded 3×3 conv
    return strides


class SmallInputCNN(nn.Sequential):
    """Three padded 3×3 convs (32, 64, 64 channels) with strides chosen from the image's H×W
    (`small_input_strides`): any image from 1×1 up."""

    def __init__(self, channels: int, activation: str, hw: tuple[int, int], widths: tuple[int, ...] = (32, 64, 64)):
        act = ACTIVATIONS[activation]
        layers: list[nn.Module] = []
        for out, stride in zip(widths, small_input_strides(hw, len(widths))):
            layers += [nn.Conv2d(channels, out, 3, stride=stride, padding=1), act()]
            channels = out
        super().__init__(*layers, nn.Flatten())

    def describe(self) -> str:
        return f"conv {_convs(self)}"


TrunkFactory = Callable[[tuple[int, int, int], str], nn.Module]
CONV_ARCHITECTURES: dict[str, TrunkFactory] = {
    "convnet_atari": lambda chw, activation: NatureCNN(chw[0], activation),
    "resnet_impala": lambda chw, activation: ImpalaResNet(chw[0], activation),
    "convnet_small": lambda chw, activation: SmallInputCNN(chw[0], activation, (chw[1], chw[2])),
}
ARCHITECTURE_CHOICES = (AUTO, *CONV_ARCHITECTURES)


def output_hw(trunk: nn.Module, hw: tuple[int, ...]) -> tuple[int, ...] | None:
    """H×W after the trunk's convs and pools (in module order; residual convs keep the size), or None
    where a kernel is larger than its padded input: the trunk does not fit the image."""
    for layer in trunk.modules():
        if not isinstance(layer, (nn.Conv2d, nn.MaxPool2d)):
            continue
        sizes = []
        for i, side in enumerate(hw):
            kernel, stride, padding, dilation = (v if isinstance(v, int) else v[i] for v in
                                                 (layer.kernel_size, layer.stride, layer.padding, layer.dilation))
            reach = dilation * (kernel - 1) + 1
            if side + 2 * padding < reach:
                return None
            sizes.append((side + 2 * padding - reach) // stride + 1)
        hw = tuple(sizes)
    return hw


def min_side(trunk: nn.Module, limit: int = 1024) -> int:
    """The smallest square image the trunk fits."""
    return next(side for side in range(1, limit) if output_hw(trunk, (side, side)) is not None)


def conv_trunk(architecture: str, chw: tuple[int, int, int], activation: str, key: str
               ) -> tuple[str, nn.Module, str]:
    """(architecture, trunk) for one image field, and why it was chosen (for the start-up log)."""
    if architecture != AUTO and architecture not in CONV_ARCHITECTURES:
        raise ValueError(f"unknown --encoder_conv_architecture={architecture!r}; "
                         f"known: {', '.join(ARCHITECTURE_CHOICES)}")
    # auto tries the Nature CNN first: built first, as before auto existed, so seeded weights stay the same
    name = "convnet_atari" if architecture == AUTO else architecture
    trunk = CONV_ARCHITECTURES[name](chw, activation)
    if output_hw(trunk, chw[1:]) is not None:
        return name, trunk, f"--encoder_conv_architecture={architecture}"
    if architecture == AUTO:
        why = f"--encoder_conv_architecture=auto; convnet_atari needs at least {_shape((min_side(trunk),) * 2)}"
        return "convnet_small", CONV_ARCHITECTURES["convnet_small"](chw, activation), why
    raise ValueError(
        f"--encoder_conv_architecture={architecture} does not fit image {key!r} of shape {_shape(chw)} ([C, H, W]): "
        f"it needs at least {_shape((min_side(trunk),) * 2)} pixels. Use --encoder_conv_architecture=auto (the "
        f"default: convnet_small where convnet_atari does not fit), convnet_small or resnet_impala")


class ConvEncoder(nn.Sequential):
    """One image field's encoder: the conv trunk, then the fully connected layers. `summary` says
    which trunk the image got and why."""

    def __init__(self, key: str, chw: tuple[int, int, int], spec: ModelSpec):
        name, trunk, why = conv_trunk(spec.encoder_conv_architecture, chw, spec.nonlinearity, key)
        out_hw = output_hw(trunk, chw[1:])
        assert out_hw is not None, "conv_trunk returns only trunks that fit"
        with torch.no_grad():
            flat = int(trunk(torch.zeros(1, *chw)).shape[1])
        super().__init__(trunk, mlp(flat, spec.encoder_conv_mlp_layers, spec.nonlinearity))
        self.out_features = spec.encoder_conv_mlp_layers[-1] if spec.encoder_conv_mlp_layers else flat
        self.summary = (f"image {key!r} {_shape(chw)}: {name} ({why}): {trunk.describe()} -> "
                        f"{_shape((flat // (out_hw[0] * out_hw[1]), *out_hw))}")


def conv_summaries(model: nn.Module) -> list[str]:
    """One line per image field of the model (a separate critic's encoders repeat the actor's)."""
    return list(dict.fromkeys(m.summary for m in model.modules() if isinstance(m, ConvEncoder)))
