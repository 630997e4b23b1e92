"""Skip mode, `--env_service=skip:<env>`: the env runs in-process, behind the same slot pool, protocol and
server code as a real env service, with the sockets skipped.

Each process that uses the address builds its own `EnvServer` without a socket and registers it here;
clients (`EnvClient`, `ServerChannel`) hand it the very messages they would send over ZeroMQ and read its
replies. A pipeline written for a rack of simulators can so be tested on a laptop, failure paths
included, before any server exists; only the sockets, and their latency, are missing.

With named pools, `--env_service_skip=POOL=ENV,...` does the same for some pools only (mock the reward
service, keep the simulator real): each rollout worker serves its share of those pools in-process.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from sf_core.service.protocol import ServiceError

if TYPE_CHECKING:
    from sf_core.service.env_server import EnvServer

PREFIX = "skip:"

_servers: dict[str, EnvServer] = {}  # address -> this process's in-process server
_lock = threading.Lock()


class SkipModeError(ValueError):
    """A skip:<env> value that cannot work."""


def is_skip(address: str) -> bool:
    return address.startswith(PREFIX)


def skip_env(value: str) -> str:
    """The env a `skip:<env>` value names."""
    env = value.strip()[len(PREFIX):].strip()
    if not env or "," in env or "*" in env:
        raise SkipModeError(f"--env_service={value}: skip mode takes one env name and nothing else, "
                            f"e.g. --env_service=skip:CartPole-v1 (each worker serves its own envs in-process)")
    return env


def skipped_pools(value: str, pools: list[str]) -> dict[str, str]:
    """`--env_service_skip=POOL=ENV,...`: which of the named `pools` are served in-process, and the env each
    serves there. SkipModeError for a pool that is not one of them, an entry without its env, or a pool twice."""
    skipped: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        pool, equals, env = (part.strip() for part in item.partition("="))
        if not equals or not pool or not env:
            raise SkipModeError(f"--env_service_skip={value}: {item!r} must be POOL=ENV, the pool and the env it "
                                f"serves in-process (e.g. reward=MockReward-v0)")
        if pool not in pools:
            raise SkipModeError(f"--env_service_skip={value}: there is no pool {pool!r} in --env_service "
                                f"(its pools: {', '.join(pools)})")
        if pool in skipped:
            raise SkipModeError(f"--env_service_skip={value} names pool {pool!r} twice")
        skipped[pool] = env
    return skipped


def serve_in_process(env: str, capacity: int, seed: int = 0, cfg=None, registry=None, owner: str = "") -> str:
    """Build `capacity` instances of `env` behind a socketless server in this process; its address,
    `skip:<env>@<owner>` (an owner, e.g. a rollout worker, has its own instances: in --serial_mode
    several workers share one process)."""
    from sf_core.service.env_server import EnvServer

    address = PREFIX + env + (f"@{owner}" if owner else "")
    server = EnvServer(env, capacity, host=None, seed=seed, registry=registry, cfg=cfg)
    with _lock:
        previous = _servers.pop(address, None)
        _servers[address] = server
    if previous is not None:
        previous.close()
    return address


def in_process_server(address: str) -> EnvServer:
    with _lock:
        server = _servers.get(address)
    if server is None:
        raise ServiceError(f"{address}: no in-process server in this process (it is closed, or was never built)")
    return server


def stop_in_process(address: str) -> None:
    with _lock:
        server = _servers.pop(address, None)
    if server is not None:
        server.close()
