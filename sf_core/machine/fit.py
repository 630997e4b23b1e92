"""Defaults that fit the machine: the flags sizing a run's sampling, chosen from the cores and the device
when neither the user nor the env's preset chose them.

    --num_workers                one rollout worker per core this process may use (its CPU affinity, so a
                                 container's or `taskset`'s limit counts, not the host's cores); fewer where a
                                 native vector env steps each split in one call and the workers are large (its
                                 backend's `cores_per_worker`, envs/vector_backends.py)
    --policy_workers_per_policy  one inference worker per 8 rollout workers, at most 4 and at most one per
                                 4 cores: one batches for several, and each more takes a share of the envs' cores
    --num_envs_per_worker        8 on the CPU; 16 with a GPU, whose forward pass costs about the same for
                                 16 envs as for 8, so bigger batches are cheaper per frame

These are starting points, not measurements of this machine: `python scripts/benchmark.py --sweep` measures
a small grid around them and prints the best flags (docs/performance.md). The console says what was fitted
at start-up, and config.json lists it (`machine_fit`). On a Ray cluster each sampler fits the flags to its
own node (a flag there describes one node), except with --env_service, whose slots are divided by the
driver's count of workers.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger("sf_core")

FITTED = ("num_workers", "num_envs_per_worker", "policy_workers_per_policy")
ROLLOUT_WORKERS_PER_INFERENCE_WORKER = 8
MAX_INFERENCE_WORKERS = 4


@dataclass(frozen=True)
class Machine:
    cores: int  # cores this process may run on
    gpu: bool  # whether the run's device is a GPU


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def this_machine(device: str) -> Machine:
    """This machine, as the run would use it: `device` is --device (a GPU only where CUDA is present)."""
    wants_gpu = device == "gpu" or device.startswith("cuda")
    if wants_gpu:
        import torch  # only here: parsing flags without a GPU flag needs no torch

        wants_gpu = torch.cuda.is_available()
    return Machine(usable_cores(), wants_gpu)


def check_device(device: str) -> None:
    """--device names a device of this machine (ConfigError if not). Without CUDA a CUDA device is not refused:
    the run falls back to the CPU with a warning (sf_core/machine/device.py, resolve_device)."""
    from sf_core.config import ConfigError

    match = re.fullmatch(r"cuda(?::(\d+))?", device)
    if device not in ("cpu", "gpu") and match is None:
        raise ConfigError(f"--device={device}: use cpu, cuda, cuda:N (the Nth GPU) or gpu (the same as cuda)")
    if match is not None and match.group(1) is not None:
        import torch

        count = torch.cuda.device_count()  # 0 without CUDA: then the run falls back to the CPU, not refused here
        if count and int(match.group(1)) >= count:
            raise ConfigError(f"--device={device}, but this machine has {count} CUDA device(s): cuda:0 to "
                              f"cuda:{count - 1}")


def fitted_values(machine: Machine, num_workers: int | None = None, cores_per_worker: int = 1) -> dict[str, int]:
    """Every fitted flag's value for `machine`; `num_workers`, when the user chose it, sizes the inference workers;
    else a rollout worker per `cores_per_worker` cores."""
    workers = max(1, machine.cores // cores_per_worker) if num_workers is None else num_workers
    inference = min(MAX_INFERENCE_WORKERS, max(1, workers // ROLLOUT_WORKERS_PER_INFERENCE_WORKER),
                    max(1, machine.cores // 4))  # many workers typed on few cores: no more processes than cores
    return {"num_workers": workers, "num_envs_per_worker": 16 if machine.gpu else 8,
            "policy_workers_per_policy": inference}


def whole_splits(envs: int, splits: int) -> int:
    """`envs` rounded up to a multiple of --worker_num_splits: every split steps as many envs."""
    return -(-envs // splits) * splits


def fit(values: dict[str, Any], chosen: set[str], machine: Machine) -> list[str]:
    """Set each fitted flag not in `chosen` (typed, or set by a preset or an env service) in `values`;
    returns the names it set."""
    from sf_core.envs.vector_backends import planned_backend  # the env registry: only once flags are fitted

    typed_workers = values["num_workers"] if "num_workers" in chosen else None
    envs = whole_splits(fitted_values(machine)["num_envs_per_worker"], values.get("worker_num_splits", 1))
    backend = planned_backend(values)
    per_worker = backend.cores_per_worker(values["num_envs_per_worker"] if "num_envs_per_worker" in chosen
                                          else envs) if backend else 1
    fitted = {**fitted_values(machine, typed_workers, per_worker), "num_envs_per_worker": envs}
    names = [name for name in FITTED if name not in chosen
             and not (name == "policy_workers_per_policy" and values.get("inference_in_rollout_workers"))]
    for name in names:
        values[name] = fitted[name]
    return names


def describe(cfg: Any, machine: Machine, where: str = "this machine") -> str:
    """One console line: what was fitted, for what, and how to choose otherwise."""
    flags = " ".join(f"--{name}={getattr(cfg, name)}" for name in cfg.machine_fit)
    device = "a GPU" if machine.gpu else "no GPU"
    return (f"fitted to {where} ({machine.cores} cores, {device}): {flags} (pass a flag to choose it; "
            f"scripts/benchmark.py --sweep measures the best)")


def refit_on_node(cfg: Any) -> Any:
    """A cluster sampler's config: the fitted flags fitted again to the node it runs on (its inference runs
    on the CPU). With --env_service the driver's values stay: it divided the slots by them."""
    if not cfg.machine_fit or cfg.env_service:
        return cfg
    machine = Machine(usable_cores(), gpu=False)
    values = {name: getattr(cfg, name) for name in (*FITTED, "env", "env_vectorization", "batched_sampling")}
    fit(values, set(FITTED) - set(cfg.machine_fit), machine)
    node_cfg = replace(cfg, **values)
    if any(getattr(node_cfg, name) != getattr(cfg, name) for name in FITTED):
        log.info("%s", describe(node_cfg, machine, "this node"))
    return node_cfg
