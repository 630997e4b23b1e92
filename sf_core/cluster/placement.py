"""Ray, where the driver talks to it: connecting, placing samplers, starting and stopping them.

Samplers are placed with one placement-group bundle per sampler: STRICT_SPREAD (one per node) when the
cluster has a node for each, SPREAD otherwise. A replacement for a lost sampler is a new actor: in its old
bundle if that is placed and free, else on any node with room (SPREAD); `room` says which, or that there is
none yet (sf_core/cluster/sampler_starts.py). A bundle whose node died is placed again by Ray on a node that
joins, if one fits. Every Ray call here is bounded in time.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import numpy as np

from sf_core.cluster.sampler import Sampler, SamplerSpec
from sf_core.config import Config, ConfigError

log = logging.getLogger("sf_core")

PLACEMENT_TIMEOUT_SEC = 60.0
# Ray returns a call's value inside its reply up to 100 KiB and through the object store above that. A shard
# of small observations (CartPole's: 110 KB) then costs a plasma create, seal, fetch and free per shard in
# the raylet, for nothing a reply could not carry. Up to this size a sampler's shards ride in the reply;
# Atari's (tens of MB) still take the object store. A driver started with RAY_max_direct_call_object_size
# gives its samplers that value instead.
INLINE_RETURN_BYTES = 1 << 20
# Weights up to this size travel inside each call: Ray inlines a call's arguments below 100 KiB (its
# RAY_max_direct_call_object_size) and would put a larger one in the object store once per call
INLINE_WEIGHTS_BYTES = 64 * 1024
CONNECT_TIMEOUT_SEC = 5.0
GCS_RECONNECT_TIMEOUT_SEC = 20


def connect(cfg: Config) -> None:
    """Join the cluster --ray_address names (or start one on this machine: local)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray ends a driver that cannot reach the head for this long (60 s by default): the run then stops
    # sooner, with the learner's checkpoint. A head that restarts slower (GCS fault tolerance) needs more.
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(GCS_RECONNECT_TIMEOUT_SEC))
    options: dict = {"namespace": "sf_core", "logging_level": logging.WARNING, "log_to_driver": True}
    if cfg.ray_address == "local":
        options.update(include_dashboard=False)
    else:
        options["address"] = cfg.ray_address
    try:
        ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RuntimeError(f"--ray_address={cfg.ray_address}: could not join the Ray cluster: {exc}") from None


def check_reachable(cfg: Config) -> None:
    """Before anything starts: Ray retries a head that is not there for a minute or more; say so at once."""
    address = cfg.ray_address
    if address in ("auto", "local"):
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_SEC).close()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--ray_address={address}: no Ray head answers there ({exc}); start one with "
                           f"`ray start --head` and pass the address it prints, or --ray_address=auto on a "
                           f"node of the cluster") from None


def driver_address(cfg: Config) -> str:
    """This machine's address as the cluster's nodes reach it: the one on its route to the head."""
    from sf_core.learning.group.network import ADDRESS, address_towards

    address = cfg.ray_address
    if address == "local":  # every node is this machine
        return ADDRESS
    if address == "auto":  # Ray's own lookup (RAY_ADDRESS, or the cluster `ray start` recorded here)
        from ray._private.services import canonicalize_bootstrap_address

        address = canonicalize_bootstrap_address("auto") or ""
    host = address.rpartition(":")[0]
    if not host:
        raise ConfigError(f"--ray_address={cfg.ray_address}: no Ray cluster found to run the learner group on")
    return address_towards(host)


def lost_errors() -> tuple[type[BaseException], ...]:
    """What a sampler's call raises when the sampler is gone (its process or node died, or it raised): its
    shards in flight are dropped and it is replaced."""
    import ray

    e = ray.exceptions
    return e.RayActorError, e.RayTaskError, e.ObjectLostError, e.OwnerDiedError, e.ActorUnavailableError


def alive_nodes() -> list[dict]:
    import ray

    return [node for node in ray.nodes() if node.get("Alive")]


def sampler_count(cfg: Config) -> int:
    return cfg.num_samplers or len(alive_nodes())


def place(cfg: Config, count: int):
    """A placement group with a bundle of --sampler_cpus per sampler, ready, or a clear error."""
    strategy = "STRICT_SPREAD" if count <= len(alive_nodes()) else "SPREAD"
    return place_bundles([{"CPU": cfg.sampler_cpus}] * count, strategy,
                         f"{count} samplers of --sampler_cpus={cfg.sampler_cpus:g}")


def place_bundles(bundles: list[dict[str, float]], strategy: str, what: str):
    """A placement group of `bundles`, ready, or an error naming `what` could not be placed and what the
    cluster has."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes = alive_nodes()
    group = placement_group(bundles, strategy=strategy)
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_SEC)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        totals: dict[str, float] = {}
        for node in nodes:
            for name, amount in node.get("Resources", {}).items():
                if name in bundles[0] or name in ("CPU", "GPU"):
                    totals[name] = totals.get(name, 0) + amount
        has = ", ".join(f"{amount:g} {name}" for name, amount in sorted(totals.items())) or "none of them"
        raise RuntimeError(f"Ray could not place {what} ({strategy}) within {PLACEMENT_TIMEOUT_SEC:.0f}s: the "
                           f"cluster has {len(nodes)} nodes and {has} in all") from None
    log.info("placed %s on %d Ray nodes (%s)", what, len(nodes), strategy)
    return group


def sampler_options(cfg: Config, strategy: Any = "SPREAD") -> dict:
    """The Ray actor options of a sampler. It is not restarted by Ray (the driver replaces it, with the newest
    weights) and its calls are never retried: a shard is not idempotent."""
    inline = os.environ.get("RAY_max_direct_call_object_size", str(INLINE_RETURN_BYTES))
    return dict(num_cpus=cfg.sampler_cpus, max_restarts=0, max_task_retries=0,
                max_concurrency=cfg.shards_in_flight + 3, scheduling_strategy=strategy,
                runtime_env={"env_vars": {"RAY_max_direct_call_object_size": inline}})


def in_bundle(group, bundle: int) -> Any:
    """The scheduling strategy that puts an actor in bundle `bundle` of `group`."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)


def room(cfg: Config, group, bundles: list[int]) -> list[Any]:
    """Where a sampler of each of `bundles` can start now: in its bundle if Ray has it placed and free, else
    SPREAD while some node has --sampler_cpus free (counting the samplers placed before it here), else None.
    Ray's view of free resources lags their use by up to a second: a start it places where the room has
    just gone waits in Ray's queue until room comes (the ingest gives it up after START_TIMEOUT_SEC)."""
    from ray._private.state import available_resources_per_node  # Ray's own, per node (ray.available_resources sums)

    free = available_resources_per_node()
    node_cpus = [resources.get("CPU", 0.0) for resources in free.values()]
    where: list[Any] = []
    for bundle in bundles:
        key = f"CPU_group_{bundle}_{group.id.hex()}" if group is not None else ""
        if key and any(resources.get(key, 0.0) >= cfg.sampler_cpus for resources in free.values()):
            where.append(in_bundle(group, bundle))
            continue
        roomiest = max(range(len(node_cpus)), key=node_cpus.__getitem__, default=None)
        if roomiest is not None and node_cpus[roomiest] >= cfg.sampler_cpus:
            node_cpus[roomiest] -= cfg.sampler_cpus
            where.append("SPREAD")
        else:
            where.append(None)
    return where


def start_sampler(cfg: Config, spec: SamplerSpec, weights_refs: list, versions: list[int], strategy: Any):
    """A sampler actor, placed by `strategy` (`in_bundle`, or SPREAD: wherever Ray finds room), starting from
    each policy's weights (`weights_refs`, of `versions`)."""
    import ray

    return ray.remote(Sampler).options(**sampler_options(cfg, strategy)).remote(spec, versions, *weights_refs)


def put_weights(arrays: dict[str, np.ndarray]) -> Any:
    """A weights version as the samplers' calls take it: small weights as they are (Ray copies them into each
    call, which costs less than an object-store round trip per node), larger ones as one object fetched once
    by each node whose samplers need it."""
    import ray

    if sum(a.nbytes for a in arrays.values()) <= INLINE_WEIGHTS_BYTES:
        return arrays
    return ray.put(arrays)


def stop_samplers(handles: list, timeout: float) -> None:
    """Ask every sampler to stop its processes, then end the actors. Never raises: a sampler may be gone
    already, or Ray may refuse calls to it (then its processes end when its own does)."""
    import ray

    calls = []
    for handle in handles:
        try:
            calls.append(handle.stop.remote())
        except Exception:  # noqa: BLE001 - Ray no longer knows the actor
            pass
    end_actors(handles, calls, timeout)


def end_actors(handles: list, calls: list, timeout: float) -> None:
    """Wait up to `timeout` for `calls` (their last work) to finish, then kill the actors. Never raises."""
    import ray

    try:
        if calls:
            ray.wait(calls, num_returns=len(calls), timeout=timeout)
    except Exception:  # noqa: BLE001 - the cluster may be going away; the actors are killed below anyway
        pass
    for handle in handles:
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
