"""A fleet file: every env service of a deployment described once, in YAML.

    workers: 2                    # the rollout workers it is sized for (the trainer's default --num_workers)
    services:
      sim:
        env: Driving-v0           # served by `python -m sf_core.env_server` (or `command:`, any server
        env_module: my_sims       #   speaking the protocol, with {port} {host} {concurrency} {seed} {gpu}
        gpus: [0, 1]              #   {container} {replica} in its words)
        replicas: 2               # servers per container (or per GPU)
        concurrency: 4            # rollouts per replica: each server's --capacity
        port: 6000                # the first port; server k of the service listens on port + k
      physics:
        endpoints: [10.0.0.7:5555*4, 10.0.0.8:5555*4]   # remote: started elsewhere, as in --env_service
      reward:
        env: RewardModel-v0
        port: 7000
        skip: true                # described as if it ran, not started: the run serves it in-process

A local service runs containers × replicas servers (a container is a group of replicas, one per GPU when
`gpus` is given: its servers see only that GPU), each with `concurrency` slots. `python -m sf_core.fleet`
starts and stops them; `--env_service=fleet.yaml` trains or evaluates on them (sf_core/service/endpoints.py):
a fleet of one service is that service's endpoints, a fleet of several is named pools, one per service.
"""

from __future__ import annotations

import difflib
import os
import shlex
import string
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from sf_core.service.addresses import Endpoint, ServiceConfigError, endpoint, yaml_item

TOP_KEYS = ("services", "workers", "run_dir")
SERVICE_KEYS = ("env", "env_module", "command", "containers", "gpus", "replicas", "concurrency", "host", "port",
                "parallel", "seed", "args", "skip", "endpoints")
LOCAL_ONLY = ("env_module", "command", "containers", "gpus", "replicas", "concurrency", "host", "port", "parallel",
              "seed", "args")
PLACEHOLDERS = ("port", "host", "concurrency", "seed", "gpu", "container", "replica")
WILDCARD_HOSTS = ("0.0.0.0", "::", "*")


class FleetError(ServiceConfigError):
    """A fleet file that cannot work; the message names the file, the service and the key."""


@dataclass(frozen=True)
class Server:
    """One local server process of a service."""

    service: str
    container: int
    replica: int
    gpu: str | None
    host: str  # the interface it binds
    port: int
    capacity: int
    seed: int  # its instance i is built with seed + i

    @property
    def address(self) -> str:
        host = "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host  # where a client on this machine connects
        return f"{host}:{self.port}"

    @property
    def name(self) -> str:
        return f"{self.service}[{self.container}.{self.replica}]"


@dataclass(frozen=True)
class Service:
    name: str
    env: str | None = None
    command: str | None = None
    env_module: str = ""
    gpus: tuple[str | None, ...] = (None,)  # one entry per container
    replicas: int = 1
    concurrency: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    parallel: bool = False
    seed: int = 0
    args: tuple[str, ...] = ()
    skip: bool = False
    remote: tuple[Endpoint, ...] = ()  # a remote service's endpoints; empty for a local one

    @property
    def local(self) -> bool:
        return not self.remote

    def servers(self) -> list[Server]:
        """Container-major: container 0's replicas, then container 1's; ports and seeds follow that order."""
        out = []
        for c, gpu in enumerate(self.gpus if self.local else ()):
            for r in range(self.replicas):
                k = c * self.replicas + r
                out.append(Server(self.name, c, r, gpu, self.host, self.port + k, self.concurrency,
                                  self.seed + k * self.concurrency))
        return out

    def endpoints(self) -> list[Endpoint]:
        if self.remote:
            return list(self.remote)
        return [Endpoint(s.address.rsplit(":", 1)[0], s.port, s.capacity) for s in self.servers()]

    def deployment(self) -> str:
        """How it is deployed, in words: `2 containers × 2 replicas × 4 concurrency`, remote, skipped."""
        if self.remote:
            return "remote"
        where = f"GPUs {', '.join(str(g) for g in self.gpus)}" if self.gpus[0] is not None else "local"
        return (f"{len(self.gpus)} container{'s' if len(self.gpus) > 1 else ''} × {self.replicas} "
                f"replica{'s' if self.replicas > 1 else ''} × {self.concurrency} concurrency, {where}"
                + (", skipped (not started)" if self.skip else ""))

    def argv(self, server: Server) -> list[str]:
        """The command line that starts `server`."""
        if self.command is not None:
            values = {"port": server.port, "host": server.host, "concurrency": server.capacity, "seed": server.seed,
                      "gpu": "" if server.gpu is None else server.gpu, "container": server.container,
                      "replica": server.replica}
            return [word.format(**values) for word in shlex.split(self.command)]
        argv = [sys.executable, "-m", "sf_core.env_server", f"--env={self.env}", f"--host={server.host}",
                f"--port={server.port}", f"--capacity={server.capacity}", f"--seed={server.seed}",
                f"--parallel={self.parallel}"]
        return argv + ([f"--env_module={self.env_module}"] if self.env_module else []) + list(self.args)


@dataclass(frozen=True)
class Fleet:
    path: str
    services: dict[str, Service]
    workers: int | None  # None: not given (the trainer keeps its own --num_workers)
    run_dir: str = field(default="")

    def pools(self) -> dict[str, list[Endpoint]]:
        """The endpoints of every service by name; a skipped service's too: they size its share."""
        return {name: s.endpoints() for name, s in self.services.items()}

    def servers(self) -> list[Server]:
        """The servers `up` starts: those of every local service that is not skipped."""
        return [server for s in self.services.values() if not s.skip for server in s.servers()]

    def skipped(self) -> dict[str, str]:
        """The skipped services' envs, by service name: what a run serves in-process instead."""
        return {name: s.env for name, s in self.services.items() if s.skip and s.env}


def read_yaml(path: str) -> Any:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)  # safe_load: a config file must not construct arbitrary objects
    except OSError as exc:
        raise FleetError(f"{path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise FleetError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None


def is_fleet_file(value: str) -> bool:
    """Whether an --env_service value is a fleet file: a YAML file with `services:`."""
    value = value.strip()
    if not (value.endswith((".yaml", ".yml")) and os.path.isfile(value)):
        return False
    data = read_yaml(value)
    return isinstance(data, dict) and "services" in data


def load_fleet(path: str) -> Fleet:
    """The fleet a file describes, checked: FleetError (one line) for anything that cannot work."""
    data = read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict) or not data["services"]:
        raise FleetError(f"{path}: expected a mapping with a non-empty 'services' mapping (service name -> "
                         f"how it is served)")
    _known_keys(data, TOP_KEYS, f"{path}")
    workers = data.get("workers")
    if workers is not None:
        workers = _positive(workers, f"{path}: workers")
    services = {str(name): _service(str(name), spec, f"{path}: service {name}")
                for name, spec in data["services"].items()}
    _check_addresses(path, services)
    return Fleet(os.path.abspath(path), services, workers, fleet_run_dir(path, data))


def fleet_run_dir(path: str, data: Any = None) -> str:
    """Where `up` keeps the state file and the servers' logs: `run_dir:` (relative to the file's folder),
    by default `<file name without .yaml>.run/` beside the file. Read without checking the rest of the file,
    so that `down` works after the file was edited."""
    data = read_yaml(path) if data is None else data
    given = data.get("run_dir") if isinstance(data, dict) else None
    base = os.path.dirname(os.path.abspath(path))
    return os.path.join(base, os.path.expanduser(str(given or os.path.splitext(os.path.basename(path))[0] + ".run")))


def _known_keys(spec: dict, known: tuple[str, ...], where: str) -> None:
    for key in spec:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise FleetError(f"{where}: unknown key {key!r}{hint}")


def _positive(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise FleetError(f"{where} must be an integer of at least 1, got {value!r}")
    return value


def _service(name: str, spec: Any, where: str) -> Service:
    if not isinstance(spec, dict):
        raise FleetError(f"{where}: expected a mapping (env or command, replicas, concurrency, port, ...), "
                         f"got {spec!r}")
    _known_keys(spec, SERVICE_KEYS, where)
    skip = spec.get("skip", False)
    if not isinstance(skip, bool):
        raise FleetError(f"{where}: skip must be true or false, got {skip!r}")
    if "endpoints" in spec:
        return _remote(name, spec, skip, where)
    if skip and not isinstance(spec.get("env"), str):
        raise FleetError(f"{where}: a skipped service is built in-process from its env: give env: NAME")
    return _local(name, spec, skip, where)


def _remote(name: str, spec: dict, skip: bool, where: str) -> Service:
    local = [key for key in LOCAL_ONLY if key in spec]
    if local or skip:
        raise FleetError(f"{where}: a remote service (endpoints) is started elsewhere; "
                         f"{', '.join(local) or 'skip'} would start or replace it here")
    items = spec["endpoints"]
    if not isinstance(items, list) or not items:
        raise FleetError(f"{where}: endpoints must be a non-empty list of host:port*capacity")
    env = spec.get("env")
    if env is not None and not isinstance(env, str):
        raise FleetError(f"{where}: env must be an env name")
    remote = tuple(_as_fleet_error(yaml_item, item, f"{where}: endpoints[{n}]") for n, item in enumerate(items))
    return Service(name, env=env, remote=remote)


def _as_fleet_error(fn: Callable[..., Endpoint], *args: Any) -> Endpoint:
    try:
        return fn(*args)
    except FleetError:
        raise
    except ServiceConfigError as exc:
        raise FleetError(str(exc)) from None


def _local(name: str, spec: dict, skip: bool, where: str) -> Service:
    env, command = spec.get("env"), spec.get("command")
    if env is None and command is None:
        raise FleetError(f"{where}: give the env it serves (env: NAME) or the command that starts a server "
                         f"(command: ...), or its endpoints if it runs elsewhere")
    if env is not None and not isinstance(env, str):
        raise FleetError(f"{where}: env must be an env name, got {env!r}")
    if command is not None:
        _check_command(command, where)
        if "args" in spec or "parallel" in spec:
            raise FleetError(f"{where}: args and parallel are sf_core.env_server flags; a service started by "
                             f"its own command takes its options in the command")
    elif "args" in spec and not (isinstance(spec["args"], list) and all(isinstance(a, str) for a in spec["args"])):
        raise FleetError(f"{where}: args must be a list of env_server flags, e.g. [--max_message_bytes=4000000]")
    if "port" not in spec:
        raise FleetError(f"{where}: port is missing (the first port; server k of the service listens on port + k)")
    port = _positive(spec["port"], f"{where}: port")
    gpus = _gpus(spec, where)
    replicas = _positive(spec.get("replicas", 1), f"{where}: replicas")
    concurrency = _positive(spec.get("concurrency", 1), f"{where}: concurrency")
    last = port + len(gpus) * replicas - 1
    _as_fleet_error(endpoint, "host", last, concurrency, f"{where}: {len(gpus) * replicas} servers from port {port}")
    seed, parallel = spec.get("seed", 0), spec.get("parallel", False)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0 or not isinstance(parallel, bool):
        raise FleetError(f"{where}: seed must be a non-negative integer and parallel true or false")
    return Service(name, env=env, command=command, env_module=str(spec.get("env_module") or ""), gpus=gpus,
                   replicas=replicas, concurrency=concurrency, host=str(spec.get("host", "127.0.0.1")), port=port,
                   parallel=parallel, seed=seed, args=tuple(spec.get("args", ())), skip=skip)


def _gpus(spec: dict, where: str) -> tuple[str | None, ...]:
    """One entry per container: the GPU its servers see, or None (no GPU assigned)."""
    gpus = spec.get("gpus")
    if gpus is None:
        return (None,) * _positive(spec.get("containers", 1), f"{where}: containers")
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        gpus = list(range(_positive(gpus, f"{where}: gpus")))
    if not isinstance(gpus, list) or not gpus or not all(isinstance(g, (int, str)) for g in gpus):
        raise FleetError(f"{where}: gpus must be a count or a non-empty list of GPU ids, got {gpus!r}")
    if "containers" in spec and spec["containers"] != len(gpus):
        raise FleetError(f"{where}: containers: {spec['containers']} but {len(gpus)} gpus; with gpus, each GPU "
                         f"is one container (leave containers out)")
    return tuple(str(g) for g in gpus)


def _check_command(command: Any, where: str) -> None:
    if not isinstance(command, str) or not command.strip():
        raise FleetError(f"{where}: command must be a command line (a string)")
    try:
        words = shlex.split(command)
        names = {f for word in words for _, f, _, _ in string.Formatter().parse(word) if f is not None}
    except ValueError as exc:
        raise FleetError(f"{where}: command cannot be read: {exc}") from None
    unknown = sorted(names - set(PLACEHOLDERS))
    if unknown:
        raise FleetError(f"{where}: command uses {{{unknown[0]}}}; it may use "
                         f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}")


def _check_addresses(path: str, services: dict[str, Service]) -> None:
    """An address belongs to one service: two servers on one port would not start, and one address in two
    pools would serve two envs with one slot."""
    owner: dict[str, str] = {}
    for s in services.values():
        for e in s.endpoints():
            if e.address in owner:
                raise FleetError(f"{path}: {e.address} belongs to service {owner[e.address]} and to service "
                                 f"{s.name}; give each server its own port")
            owner[e.address] = s.name
