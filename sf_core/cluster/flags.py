"""What a cluster run (--ray_address) needs of the other flags, checked before anything starts."""

from __future__ import annotations

import importlib.util

from sf_core.config import Config, ConfigError, register_check


@register_check
def check_cluster_flags(cfg: Config) -> None:
    if not cfg.ray_address:
        return
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("--ray_address needs Ray, which is not installed: pip install -e \".[ray]\" "
                          "(or pip install 'ray>=2.9')")
    if cfg.num_samplers < 0:
        raise ConfigError(f"--num_samplers must be 0 (one per node) or more, got {cfg.num_samplers}")
    if cfg.shards_in_flight < 1:
        raise ConfigError(f"--shards_in_flight must be at least 1, got {cfg.shards_in_flight}")
    if not cfg.sampler_cpus > 0:
        raise ConfigError(f"--sampler_cpus must be positive, got {cfg.sampler_cpus}")
    if cfg.max_sampler_restarts < 0:
        raise ConfigError(f"--max_sampler_restarts must be at least 0, got {cfg.max_sampler_restarts}")
    if not cfg.learner_cpus > 0:
        raise ConfigError(f"--learner_cpus must be positive, got {cfg.learner_cpus}")
    parse_resources(cfg.learner_resources)
    if not cfg.async_rl:
        raise ConfigError("--ray_address samples asynchronously (each node keeps sampling while the learner "
                          "trains; V-trace or PPO's clipping handle the lag): --async_rl must be True")
    if cfg.num_batches_to_accumulate:
        raise ConfigError("--ray_address samples asynchronously with no bound on the datasets collected ahead: "
                          "--num_batches_to_accumulate must be 0")


def parse_resources(value: str) -> dict[str, float]:
    """`NAME:AMOUNT,...` (--learner_resources) as Ray's custom resources; ConfigError if it is not that."""
    resources = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, _, amount = item.partition(":")
        try:
            resources[name.strip()] = float(amount)
        except ValueError:
            raise ConfigError(f"--learner_resources={value}: {item!r} is not NAME:AMOUNT (e.g. learner:1)") from None
        if not name.strip() or name.strip() in ("CPU", "GPU", "memory") or not resources[name.strip()] > 0:
            raise ConfigError(f"--learner_resources={value}: {item!r} must name a custom resource (not CPU, GPU "
                              f"or memory: see --learner_cpus and --device) with a positive amount")
    return resources
