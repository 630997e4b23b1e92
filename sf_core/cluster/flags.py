"""What a cluster run (--ray_address) needs of the other flags, checked before anything starts."""

from __future__ import annotations

import importlib.util

from sf_core.config import Config, ConfigError


def check_cluster_flags(cfg: Config) -> None:
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
    if not cfg.async_rl:
        raise ConfigError("--ray_address samples asynchronously (each node keeps sampling while the learner "
                          "trains; V-trace or PPO's clipping handle the lag): --async_rl must be True")
