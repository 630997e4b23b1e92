"""Where each model of an algorithm runs: the algorithm's defaults, then --model_devices and --offload_models.

Checked in the runner before any process starts (`check_placement`): a model the graph never calls, a device
torch cannot name or this machine does not have, or an offloaded model that trains, is one error naming the
flag; an offloaded model on the CPU is left in place, with a warning. The learner then applies the same placement
to the models it builds (`place_models`). `check_concurrency` refuses what train_steps running at once cannot do.
"""

from __future__ import annotations

import logging

import torch

from sf_core.algo.executor import train_steps_at_once
from sf_core.algo.graph import DataflowGraph, ModelSlot, Node
from sf_core.config import Config, ConfigError

log = logging.getLogger("sf_core")
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


def check_placement(cfg: Config, nodes: list[Node], defaults: dict[str, str], parts: dict[str, str] | None = None
                    ) -> None:
    """`parts`: models that are shares of another's parameters (the actor of --split_actor_critic), which run
    where that one runs."""
    called = {node.model for node in nodes if node.model is not None}
    trained = {node.model for node in nodes if node.kind == "train_step"}
    others = ", ".join(sorted(called - {LEARNER_MODEL})) or "none"
    devices = {**defaults, **parse_devices(cfg.model_devices)}
    for name, device in devices.items():
        if name == LEARNER_MODEL or (parts or {}).get(name) == LEARNER_MODEL:
            part = f"{name} is a part of {LEARNER_MODEL}, which" if name != LEARNER_MODEL else LEARNER_MODEL
            raise ConfigError(f"--model_devices: {part} runs on --device (now {cfg.device!r})")
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
        if offloads_nothing(devices.get(name, cfg.device)):
            log.warning("--offload_models: %s runs on the CPU, whose memory is the host memory it would wait in: "
                        "nothing to offload, it stays where it is", name)


def offloads_nothing(device: str) -> bool:
    """A model on the CPU would wait in the memory it runs from: its copies would be pure overhead. (--device=gpu
    or cuda on a machine without one falls back to the CPU.)"""
    return not (device == "gpu" or device.startswith("cuda")) or not torch.cuda.is_available()


def place_models(models: dict[str, ModelSlot], cfg: Config, defaults: dict[str, str]) -> None:
    """Move each extra model to its device, and mark the offloaded ones (the executor keeps them in host memory)
    unless they run on the CPU (`check_placement` said so)."""
    devices = {**defaults, **parse_devices(cfg.model_devices)}
    offloaded = set(parse_names(cfg.offload_models))
    for name, slot in models.items():
        if name == LEARNER_MODEL or slot.part_of is not None:
            continue
        if name in devices:
            slot.device = devices[name]
            slot.module.to(slot.device)
        if name in offloaded and not offloads_nothing(slot.device):
            slot.offload_device = "cpu"


def check_concurrency(cfg: Config, graph: DataflowGraph) -> None:
    """Publishing the weights after every SGD step needs the steps one by one: a step's weights would go out while
    another model's step, on another thread, is halfway through."""
    at_once = train_steps_at_once(graph) if cfg.overlap_graph_nodes and cfg.num_learners == 1 else []
    if at_once and cfg.publish_every_sgd_step:
        raise ConfigError(f"--publish_every_sgd_step=True with --overlap_graph_nodes=True: --algo={cfg.algo} runs "
                          f"the train_steps {', '.join(at_once[0])} at once, and a step's weights would be published "
                          f"while another's are half updated; turn one of the two flags off")
