"""Env service endpoints: parsing `--env_service` and dividing the slots among workers.

`--env_service=skip:<env>` serves each worker's envs in-process instead (sf_core/service/skip.py).

`--env_service=127.0.0.1:5555*4,127.0.0.1:5556*4` lists addresses with the number of concurrent env
instances (slots) each serves. For bigger setups the flag names a YAML file instead:

    endpoints:
      - 127.0.0.1:5555*4                                 # the same syntax as the flag
      - {host: 10.0.0.7, port: 5555, capacity: 8}        # or spelled out

or named pools (`parse_pools`), so that an evaluation task, or an env being trained, can need a slot of
several (sf_core/service/service_set.py):

    pools:
      sim: [127.0.0.1:5555*2]
      reward: ["127.0.0.1:6000*1", {host: 127.0.0.1, port: 6001, capacity: 1}]

or a fleet file (`services:`, sf_core/service/fleet_file.py): one service is its endpoints, several are named
pools, one per service.

How the slots are divided among the workers (contiguous slices, spare slots, the smallest pool) is in
sf_core/service/capacity.py.
"""

from __future__ import annotations

import os

from sf_core.config import Config, ConfigError, register_check
from sf_core.service.addresses import Endpoint, ServiceConfigError, SlotAddress, parse_item, yaml_item
from sf_core.service.capacity import CapacityPlan, all_slots, describe, envs_per_worker, plan_capacity, worker_slice
from sf_core.service.fleet_file import is_fleet_file, load_fleet
from sf_core.service.skip import SkipModeError, is_skip, skip_env, skipped_pools


def _load_yaml(path: str) -> list[Endpoint]:
    import yaml

    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)  # safe_load: a config file must not construct arbitrary objects
    items = data.get("endpoints") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ServiceConfigError(f"{path}: expected a mapping with a non-empty 'endpoints' list")
    return [yaml_item(item, f"{path}: endpoints[{n}]") for n, item in enumerate(items)]


def parse_pools(value: str) -> dict[str, list[Endpoint]] | None:
    """The named pools of an --env_service YAML file with a `pools:` mapping (pool name -> its endpoints,
    each listed as under `endpoints:`), or None when the value is not such a file. An address may belong
    to one pool only: a slot leased from two pools at once would serve two tasks."""
    value = value.strip()
    if not (value.endswith((".yaml", ".yml")) and os.path.isfile(value)):
        return None
    if is_fleet_file(value):  # a fleet of several services is named pools, one per service
        fleet = load_fleet(value)
        return fleet.pools() if len(fleet.services) > 1 else None
    import yaml

    with open(value, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or "pools" not in data:
        return None
    if "endpoints" in data:
        raise ServiceConfigError(f"{value}: give either 'pools' (named pools) or 'endpoints', not both")
    if not isinstance(data["pools"], dict) or not data["pools"]:
        raise ServiceConfigError(f"{value}: 'pools' must map pool names to lists of endpoints")
    pools, owner = {}, {}
    for name, items in data["pools"].items():
        if not isinstance(items, list) or not items:
            raise ServiceConfigError(f"{value}: pool {name!r} has no slots (give it a non-empty list of endpoints)")
        pools[str(name)] = [yaml_item(item, f"{value}: pools.{name}[{n}]") for n, item in enumerate(items)]
        for e in pools[str(name)]:
            if e.address in owner:
                raise ServiceConfigError(f"{value}: {e.address} is listed in pool {owner[e.address]!r} and in "
                                         f"pool {name!r}; an address belongs to one pool, with its whole capacity")
            owner[e.address] = name
    return pools


def parse_service(value: str) -> list[Endpoint]:
    """`host:port*cap,...` or the path of a YAML file; duplicate addresses are rejected."""
    value = value.strip()
    if not value:
        raise ServiceConfigError("--env_service is empty")
    if value.endswith((".yaml", ".yml")) or os.path.isfile(value):
        if not os.path.isfile(value):
            raise ServiceConfigError(f"--env_service={value}: no such file")
        endpoints = _fleet_endpoints(value) if is_fleet_file(value) else _load_yaml(value)
    else:
        endpoints = [parse_item(item, "--env_service") for item in value.split(",") if item.strip()]
    seen: set[str] = set()
    for e in endpoints:
        if e.address in seen:
            raise ServiceConfigError(f"--env_service lists {e.address} twice; give it one entry with its whole capacity")
        seen.add(e.address)
    return endpoints


def _fleet_endpoints(path: str) -> list[Endpoint]:
    """The endpoints of a fleet file's one service (a fleet of several is named pools: `parse_pools`)."""
    fleet = load_fleet(path)
    if len(fleet.services) != 1:
        raise ServiceConfigError(f"{path} describes {len(fleet.services)} services, so named pools, one per "
                                 f"service: read it with parse_pools")
    return list(fleet.pools().values())[0]


def service_capacity(value: str, workers: int) -> CapacityPlan:
    """How --env_service=value's slots are divided among `workers` rollout workers: one pool (named "") for
    addresses, one per pool for named pools. `python -m sf_core.fleet` prints the same plan."""
    named = parse_pools(value)
    return plan_capacity(named if named is not None else {"": parse_service(value)}, workers)


def fleet_skipped(value: str) -> dict[str, str]:
    """The services a fleet file marks `skip: true`, {service: env}; {} for any other value."""
    return load_fleet(value.strip()).skipped() if is_fleet_file(value) else {}


def fleet_workers(value: str) -> int | None:
    """The rollout workers a fleet file is sized for (its `workers:`), None for any other value."""
    try:
        return load_fleet(value.strip()).workers if is_fleet_file(value) else None
    except ServiceConfigError:
        return None  # apply_to_training reports what is wrong with the file


def envs_served(values: dict) -> bool:
    """Whether --env_service serves the envs, so that the command line makes none to read its spaces."""
    return bool(values["env_service"])


def set_by_services(values: dict) -> set[str]:
    """The flags --env_service decides (`apply_to_training`), which no machine fit may choose."""
    if not values["env_service"]:
        return set()
    return {"num_envs_per_worker"} | ({"num_workers"} if fleet_workers(values["env_service"]) else set())


def apply_to_training(values: dict, typed: set[str]) -> None:
    """With --env_service, a worker's envs are its share of the slots: set --num_envs_per_worker to it
    (and lower an untyped --worker_num_splits to a divisor of it). A typed --num_envs_per_worker above the
    share is kept: the run is planned for slots to be added while it trains (elastic pools), and the envs
    beyond the slots wait for them. Raises with the arithmetic when the capacity cannot feed the workers or
    a typed flag is below the share. Skip mode keeps --num_envs_per_worker: each worker serves that many envs
    in-process. Without --env_service, nothing changes."""
    if not values["env_service"]:
        return
    if is_skip(values["env_service"]):
        check_skip(values["env_service"], values["env"])
        return
    if "num_workers" not in typed and (workers := fleet_workers(values["env_service"])):
        values["num_workers"] = workers  # the workers the fleet is sized for
    share, arithmetic = training_share(values["env_service"], values["num_workers"])
    if "num_envs_per_worker" in typed and values["num_envs_per_worker"] < share:
        raise ServiceConfigError(
            f"--num_envs_per_worker={values['num_envs_per_worker']} contradicts --env_service: {arithmetic}; "
            f"drop --num_envs_per_worker (it is computed), or give more, for slots to be added while training")
    envs = values["num_envs_per_worker"] if "num_envs_per_worker" in typed else share
    values["num_envs_per_worker"] = envs
    splits = values["worker_num_splits"]
    if envs % splits:
        if "worker_num_splits" in typed:
            raise ServiceConfigError(
                f"--worker_num_splits={splits} does not divide the envs per worker: "
                f"{arithmetic if envs == share else f'--num_envs_per_worker={envs}'}, not divisible by {splits}")
        values["worker_num_splits"] = max(d for d in range(1, splits + 1) if envs % d == 0)


def training_share(value: str, workers: int) -> tuple[int, str]:
    """Each rollout worker's envs under --env_service=value, and the arithmetic. With named pools an env
    holds one slot of every pool, so a worker runs as many envs as its smallest share of a pool."""
    plan = service_capacity(value, workers)
    return plan.envs_per_worker, plan.arithmetic()


def check_skip(value: str, env: str) -> None:
    """`skip:<env>` must name the env being trained (it is served in-process, from the registry)."""
    try:
        served = skip_env(value)
    except SkipModeError as exc:
        raise ServiceConfigError(str(exc)) from None
    if served != env:
        raise ServiceConfigError(f"--env_service={value} serves {served!r}, but --env={env}; skip mode serves "
                                 f"the env being trained: --env_service=skip:{env}")


def skipped_named_pools(value: str, skip: str) -> dict[str, str]:
    """The pools of --env_service=value that --env_service_skip=skip serves in-process: {pool: env}."""
    if not skip:
        return {}
    named = parse_pools(value) if value else None
    if named is None:
        raise ServiceConfigError(f"--env_service_skip={skip} names pools of an --env_service YAML file with "
                                 f"'pools:'; to serve a whole run in-process, use --env_service=skip:ENV")
    try:
        return skipped_pools(skip, list(named))
    except SkipModeError as exc:
        raise ServiceConfigError(str(exc)) from None


def pools_served_in_process(value: str, skip: str) -> dict[str, str]:
    """The named pools of --env_service=value a run serves in-process, {pool: env}: a fleet file's services
    marked `skip: true`, and those --env_service_skip=skip names (which win where both name a pool)."""
    return {**fleet_skipped(value), **skipped_named_pools(value, skip)}


def probe(endpoints: list[Endpoint], timeout: float) -> tuple[dict[str, dict], list[str]]:
    """Ask every address what it serves: {address: its hello (env, capacity, spaces)}, and a description
    of each address that did not answer within `timeout`."""
    from sf_core.service.remote_env import EnvClient, ServiceError, hello

    answers, silent = {}, []
    for e in endpoints:
        client = EnvClient(e.address, timeout)
        try:
            answers[e.address] = hello(client)
        except ServiceError as exc:
            silent.append(f"{e.address} ({exc})")
        finally:
            client.close()
    return answers, silent


def answers_with_capacity(endpoints: list[Endpoint], timeout: float, hint: str = "") -> dict[str, dict]:
    """Every address's hello, by address; ServiceConfigError if one does not answer within `timeout`
    (followed by `hint`) or has fewer slots than listed."""
    answers, silent = probe(endpoints, timeout)
    if silent:
        raise ServiceConfigError(f"env servers did not answer: {'; '.join(silent)}{hint}")
    for e in endpoints:
        if answers[e.address]["capacity"] < e.capacity:
            raise ServiceConfigError(f"--env_service lists {e} but that server has only "
                                     f"{answers[e.address]['capacity']} slots")
    return answers


def check_training_endpoints(endpoints: list[Endpoint], env: str, timeout: float) -> dict:
    """Before training: every address answers, serves `env` with the same spaces and has the capacity the
    flag claims. Returns one server's description; raises ServiceConfigError naming what is wrong."""
    first = endpoints[0]
    answers = answers_with_capacity(endpoints, timeout, f"; start them first, e.g. python -m sf_core.env_server "
                                                        f"--env={env} --port={first.port} --capacity={first.capacity}")
    reference = None
    for e in endpoints:
        d = answers[e.address]
        if d["env"] != env:
            raise ServiceConfigError(f"{e.address} serves {d['env']!r}, but --env={env}")
        spaces = (d["observation_space"], d["action_space"])
        if reference is None:
            reference = d
        elif spaces != (reference["observation_space"], reference["action_space"]):
            raise ServiceConfigError(f"{e.address} serves {env} with other spaces than {endpoints[0].address}")
    return reference


@register_check
def check_training_flags(cfg: Config) -> None:
    """The trainer's --env_service flags: the endpoints parse, each worker's share of their slots is
    --num_envs_per_worker, and a server may not take as long as a heartbeat."""
    if not cfg.env_service:
        if cfg.env_service_skip:
            raise ConfigError(f"--env_service_skip={cfg.env_service_skip} needs --env_service (a YAML file of "
                              f"named pools)")
        return
    if cfg.eval_every_env_steps:
        raise ConfigError("--eval_every_env_steps does not work with --env_service: the evaluator would build its env "
                          "in its own process, where served envs are not built; evaluate checkpoints with "
                          "python -m sf_core.evaluate instead")
    if cfg.env_vectorization not in ("auto", "none"):  # auto: the served envs, one by one
        raise ConfigError(f"--env_vectorization={cfg.env_vectorization} makes each split one vector env in its "
                          f"rollout worker, which --env_service (envs on env servers) rules out: use "
                          f"--env_vectorization=none or auto")
    if cfg.env_service_timeout >= cfg.heartbeat_timeout:
        raise ConfigError(f"--env_service_timeout={cfg.env_service_timeout:g} must be shorter than "
                          f"--heartbeat_timeout={cfg.heartbeat_timeout:g}: a worker waiting on a server "
                          f"that long would be reported as stalled")
    try:
        skipped_named_pools("" if is_skip(cfg.env_service) else cfg.env_service, cfg.env_service_skip)
        if is_skip(cfg.env_service):
            check_skip(cfg.env_service, cfg.env)
            return
        share, arithmetic = training_share(cfg.env_service, cfg.num_workers)
        if fleet_skipped(cfg.env_service) and parse_pools(cfg.env_service) is None:
            raise ServiceConfigError(
                f"--env_service={cfg.env_service}: its one service has skip: true, which is skip mode: train "
                f"with --env_service=skip:{cfg.env}")
    except ServiceConfigError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.num_envs_per_worker < share:  # parse_args sets it; a Config built in Python may not
        raise ConfigError(f"--num_envs_per_worker={cfg.num_envs_per_worker} must be at least each worker's share "
                          f"of --env_service: {arithmetic}")
    if cfg.num_envs_per_worker > share and cfg.datasets_ahead() is not None:
        if cfg.async_rl:
            raise ConfigError(f"--num_envs_per_worker={cfg.num_envs_per_worker} plans for more envs than the slots "
                              f"({arithmetic}), and with --num_batches_to_accumulate each dataset waits for every "
                              f"env: the envs waiting for slots would stop training; leave it at 0")
        raise ConfigError(f"--num_envs_per_worker={cfg.num_envs_per_worker} plans for more envs than the slots "
                          f"({arithmetic}), and with --async_rl=False a dataset needs every env: the envs waiting "
                          f"for slots would stop training; use --async_rl=True (the default)")
