"""What training asks of env services, in one place: the spaces the served env has, a rollout worker's share of
the slots, and that share on a cluster. Each function answers for a run without --env_service too (None, or the
config unchanged), so the engine never reads the flag to decide whether to call it."""

from __future__ import annotations

import logging
from dataclasses import replace

import gymnasium as gym

from sf_core.envs.registry import EnvNotFoundError, EnvRegistry
from sf_core.config import Config, ConfigError
from sf_core.service.endpoints import (Endpoint, ServiceConfigError, answers_with_capacity, check_training_endpoints,
                                       parse_pools, parse_service, pools_served_in_process, training_share,
                                       worker_slice)
from sf_core.service.elastic import fleet_source
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
            obs_space, action_space = probe_composed_spaces(cfg, registry, _probe_group(cfg, registry, named))
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
    follow: list[tuple[EnvPool, str | None, list[Endpoint]]] = []  # pools on servers, and what they serve
    if is_skip(cfg.env_service):  # this worker's own envs, served in-process without sockets
        pool = _in_process_pool(cfg, registry, cfg.env, cfg.num_envs_per_worker, seed + 10_007 * worker, owner)
        mine = [s.name for s in pool.slots]
    elif (named := parse_pools(cfg.env_service)) is not None:  # one slot of every pool per env (service_set.py)
        skipped = pools_served_in_process(cfg.env_service, cfg.env_service_skip)
        pools, mine = {}, []
        for name, endpoints in named.items():
            sliced = worker_slice(endpoints, workers, me)
            if name in skipped:  # this worker's share of the pool, served in-process (--env_service_skip)
                pools[name] = _in_process_pool(cfg, registry, skipped[name], len(sliced), seed + 10_007 * worker,
                                               f"{owner}/{name}")
                mine += [f"{name}: {s.name}" for s in pools[name].slots]
            else:
                pools[name] = _env_pool(cfg, [(f"{s.host}:{s.port}", s.index) for s in sliced], None)
                follow.append((pools[name], name, endpoints))
                mine += [f"{name}: {s}" for s in sliced]
        pool = PoolGroup(pools)
    else:
        endpoints = parse_service(cfg.env_service)
        sliced = worker_slice(endpoints, workers, me)
        mine = [str(s) for s in sliced]
        pool = _env_pool(cfg, [(f"{s.host}:{s.port}", s.index) for s in sliced], cfg.env)
        follow.append((pool, None, endpoints))
    pool.describe(timeout=cfg.env_service_timeout)
    for served, name, endpoints in follow:  # on a fleet file: slots added and drained while the run goes on
        if (source := fleet_source(cfg.env_service, name, endpoints, workers, me)) is not None:
            served.follow(source)
    log.info("%s: %d env slots (%s%s)", owner, len(mine), ", ".join(mine[:8]), ", ..." if len(mine) > 8 else "")
    return pool


def _env_pool(cfg: Config, slots: list[tuple[str, int]], env: str | None) -> EnvPool:
    return EnvPool(slots, env, cfg.env_service_timeout, cfg.env_service_recheck_interval)


def envs_built_in_process(cfg: Config) -> tuple[str, ...]:
    """The envs a run's rollout workers build from the registry besides --env: those of the pools
    --env_service_skip serves in-process (their factories travel to the workers with --env's)."""
    if not cfg.env_service or is_skip(cfg.env_service) or parse_pools(cfg.env_service) is None:
        return ()
    return tuple(pools_served_in_process(cfg.env_service, cfg.env_service_skip).values())


def _in_process_pool(cfg: Config, registry: EnvRegistry, env: str, capacity: int, seed: int, owner: str) -> EnvPool:
    """`capacity` instances of `env` on a socketless server of this process (skip mode), as a pool that
    stops the server when it closes."""
    try:
        address = serve_in_process(env, capacity, seed, cfg, registry, owner=owner)
    except EnvNotFoundError as exc:
        raise ServiceConfigError(f"--env_service_skip serves {env!r} in-process, which this process cannot "
                                 f"build: {exc}") from None
    pool = _env_pool(cfg, [(address, i) for i in range(capacity)], env)
    pool.on_close = lambda: stop_in_process(address)
    return pool


def _probe_group(cfg: Config, registry: EnvRegistry, named: dict[str, list[Endpoint]]) -> PoolGroup:
    """Every slot of the named pools, for composing the env once before training: each address must answer
    with the capacity listed, except those of pools served in-process (one instance here)."""
    skipped = pools_served_in_process(cfg.env_service, cfg.env_service_skip)
    answers_with_capacity([e for name, pool in named.items() if name not in skipped for e in pool],
                          cfg.env_service_timeout)
    pools: dict[str, EnvPool] = {}
    try:
        for name, endpoints in named.items():
            pools[name] = (_in_process_pool(cfg, registry, skipped[name], 1, cfg.seed, f"probe/{name}")
                           if name in skipped else
                           _env_pool(cfg, [(e.address, i) for e in endpoints for i in range(e.capacity)], None))
    except ServiceConfigError:
        PoolGroup(pools).close()
        raise
    return PoolGroup(pools)


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
    # more envs than one node's share was typed: the run is planned for slots added while it trains
    envs = max(share, cfg.num_envs_per_worker) if cfg.num_envs_per_worker > one_node_share(cfg) else share
    splits = max(d for d in range(1, cfg.worker_num_splits + 1) if envs % d == 0)
    return replace(cfg, num_envs_per_worker=envs, worker_num_splits=splits)


def one_node_share(cfg: Config) -> int:
    """Each worker's share as the flags were resolved, for one node's --num_workers."""
    return training_share(cfg.env_service, cfg.num_workers)[0]
