"""Where each model of an algorithm runs: the algorithm's defaults, then --model_devices and --offload_models.

Checked in the runner before any process starts (`check_placement`): a model the graph never calls, a device
torch cannot name or this machine does not have, or an offloaded model that trains, is one error naming the
flag. The learner then applies the same placement to the models it builds (`place_models`).
"""

from __future__ import annotations

import torch

from sf_core.algo.graph import ModelSlot, Node
from sf_core.config import Config, ConfigError

LEARNER_MODEL = "actor_critic"  # placed by --device, with the inference workers' copy


def parse_devices(text: str) -> dict[str, str]:
    """'teacher=cuda:1, rnd_target=cpu' -> {'teacher': 'cuda:1', 'rnd_target': 'cpu'}."""
    found = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        name, sep, device = pair.partition("=")
        if not sep or not name.strip() or not device.strip():
            raise ConfigError(f"--model_devices: {pair!r} is not NAME=DEVICE (e.g. teacher=cuda:0)")
        found[name.strip()] = device.strip()
    return found


def parse_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def check_device(device: str, flag: str) -> None:
    """A device torch can name and this machine has."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"{flag}: unknown device {device!r} (cpu, cuda or cuda:N)") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = parsed.index or 0
        if index >= count:
            raise ConfigError(f"{flag}: device {device!r} is not on this machine ({count} CUDA device(s))")
    elif parsed.type != "cpu":
        raise ConfigError(f"{flag}: device {device!r} is not one a model can train or run on here (cpu, cuda:N)")


def check_placement(cfg: Config, nodes: list[Node], defaults: dict[str, str]) -> None:
    called = {node.model for node in nodes if node.model is not None}
    trained = {node.model for node in nodes if node.kind == "train_step"}
    others = ", ".join(sorted(called - {LEARNER_MODEL})) or "none"
    for name, device in {**defaults, **parse_devices(cfg.model_devices)}.items():
        if name == LEARNER_MODEL:
            raise ConfigError(f"--model_devices: {LEARNER_MODEL} runs on --device (now {cfg.device!r})")
        if name not in called:
            raise ConfigError(f"--model_devices: --algo={cfg.algo} calls no model {name!r} (its other models: "
                              f"{others})")
        check_device(device, f"--model_devices {name}")
    for name in parse_names(cfg.offload_models):
        if name not in called or name == LEARNER_MODEL:
            raise ConfigError(f"--offload_models: --algo={cfg.algo} has no frozen model {name!r} (its other models: "
                              f"{others})")
        if name in trained:
            raise ConfigError(f"--offload_models: {name!r} is trained by --algo={cfg.algo}; only a frozen model "
                              f"(one no train_step node calls) can wait off its device")


def place_models(models: dict[str, ModelSlot], cfg: Config, defaults: dict[str, str]) -> None:
    """Move each extra model to its device, and mark the offloaded ones (the executor keeps them in host memory)."""
    devices = {**defaults, **parse_devices(cfg.model_devices)}
    offloaded = set(parse_names(cfg.offload_models))
    for name, slot in models.items():
        if name == LEARNER_MODEL:
            continue
        if name in devices:
            slot.device = devices[name]
            slot.module.to(slot.device)
        if name in offloaded:
            slot.offload_device = "cpu"
