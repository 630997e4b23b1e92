"""What training asks of env services, in one place: the spaces the served env has, a rollout worker's share of
the slots, and that share on a cluster. Each function answers for a run without --env_service too (None, or the
config unchanged), so the engine never reads the flag to decide whether to call it."""

from __future__ import annotations

import logging
from dataclasses import replace

import gymnasium as gym

from sf_core.envs.registry import EnvRegistry
from sf_core.config import Config, ConfigError
from sf_core.service.endpoints import (ServiceConfigError, check_training_endpoints, parse_pools, parse_service,
                                       training_share, worker_slice)
from sf_core.service.env_pool import EnvPool
from sf_core.service.protocol import ServiceError, space_from_json
from sf_core.service.remote_env import EnvClient, close_context, hello
from sf_core.service.service_set import PoolGroup, probe_composed_spaces
from sf_core.service.skip import is_skip, serve_in_process, stop_in_process

log = logging.getLogger("sf_core")


def probe_spaces(cfg: Config, registry: EnvRegistry) -> tuple[gym.Space, gym.Space, int] | None:
    """The env's spaces and its number of agents as the services give them; None without --env_service.
    Every server must answer and serve --env with the capacity the flag lists; the spaces come from their
    description (the trainer does not need the env's code). With named pools, --env is the registered
    composition of their envs, built once on one slot of each."""
    if not cfg.env_service:
        return None
    if is_skip(cfg.env_service):  # asked through the protocol, as a rollout worker will ask its own server
        address = serve_in_process(cfg.env, 1, cfg=cfg, registry=registry)
        try:
            d = hello(EnvClient(address))
        finally:
            stop_in_process(address)
        return space_from_json(d["observation_space"]), space_from_json(d["action_space"]), 1
    try:
        named = parse_pools(cfg.env_service)
        if named is not None:  # the env is composed from one slot of each pool: built once here
            obs_space, action_space = probe_composed_spaces(cfg, registry, named)
            return obs_space, action_space, 1
        d = check_training_endpoints(parse_service(cfg.env_service), cfg.env, cfg.env_service_timeout)
    except (ServiceConfigError, ServiceError) as exc:
        raise ConfigError(f"--env_service: {exc}") from None
    finally:
        close_context()  # no ZeroMQ I/O threads in a process about to fork the workers
    return space_from_json(d["observation_space"]), space_from_json(d["action_space"]), 1


def open_worker_pool(cfg: Config, registry: EnvRegistry, worker: int, seed: int, owner: str,
                     sampler: tuple[int, int] = (0, 1)) -> EnvPool | PoolGroup | None:
    """Rollout worker `worker`'s slots (None without --env_service), described and ready: its contiguous slice
    of every server's (or named pool's), or, in skip mode, its own envs served in-process. On a cluster every
    node's workers share the slots: `sampler` is (this sampler's index, how many samplers)."""
    if not cfg.env_service:
        return None
    index, samplers = sampler
    workers, me = cfg.num_workers * samplers, index * cfg.num_workers + worker
    pool: EnvPool | PoolGroup
    if is_skip(cfg.env_service):  # this worker's own envs, served in-process without sockets
        address = serve_in_process(cfg.env, cfg.num_envs_per_worker, seed + 10_007 * worker, cfg, registry,
                                   owner=owner)
        mine = [f"{address}#{i}" for i in range(cfg.num_envs_per_worker)]
        pool = _env_pool(cfg, [(address, i) for i in range(cfg.num_envs_per_worker)], cfg.env)
        pool.on_close = lambda: stop_in_process(address)
    elif (named := parse_pools(cfg.env_service)) is not None:  # one slot of every pool per env (service_set.py)
        pools, mine = {}, []
        for name, endpoints in named.items():
            sliced = worker_slice(endpoints, workers, me)
            pools[name] = _env_pool(cfg, [(f"{s.host}:{s.port}", s.index) for s in sliced], None)
            mine += [f"{name}: {s}" for s in sliced]
        pool = PoolGroup(pools)
    else:
        sliced = worker_slice(parse_service(cfg.env_service), workers, me)
        mine = [str(s) for s in sliced]
        pool = _env_pool(cfg, [(f"{s.host}:{s.port}", s.index) for s in sliced], cfg.env)
    pool.describe(timeout=cfg.env_service_timeout)
    log.info("%s: %d env slots (%s%s)", owner, len(mine), ", ".join(mine[:8]), ", ..." if len(mine) > 8 else "")
    return pool


def _env_pool(cfg: Config, slots: list[tuple[str, int]], env: str | None) -> EnvPool:
    return EnvPool(slots, env, cfg.env_service_timeout, cfg.env_service_recheck_interval)


def share_among_samplers(cfg: Config, samplers: int) -> Config:
    """With --env_service, the slots are divided among every node's rollout workers (samplers × --num_workers),
    not among one node's as the flags were resolved: each sampler's workers run their own share, so no slot
    serves two workers. Raises ServiceConfigError, with the arithmetic, when the slots cannot feed every worker."""
    if not cfg.env_service or is_skip(cfg.env_service):
        return cfg
    workers = cfg.num_workers * samplers
    try:
        share, _ = training_share(cfg.env_service, workers)
    except ServiceConfigError:
        pools = parse_pools(cfg.env_service) or {"": parse_service(cfg.env_service)}
        slots = min(sum(e.capacity for e in endpoints) for endpoints in pools.values())
        advice = (f"--num_workers={slots // samplers} or fewer" if slots >= samplers else
                  f"--num_samplers={slots} with --num_workers=1")
        raise ServiceConfigError(
            f"--env_service has {slots} slots{' per pool' if len(pools) > 1 else ''} for {samplers} samplers × "
            f"--num_workers={cfg.num_workers} = {workers} rollout workers: on a cluster every node's workers share "
            f"the slots, and each needs at least one; use {advice}, or add capacity") from None
    splits = max(d for d in range(1, cfg.worker_num_splits + 1) if share % d == 0)
    return replace(cfg, num_envs_per_worker=share, worker_num_splits=splits)
