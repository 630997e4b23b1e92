"""The evaluator's plan, made before anything starts: which pools of slots there are (or which envs are
built in-process), how many task runners run where, and how the policy acts. Everything wrong with the
flags, the tasks or the services is an EvalError here (exit code 2).

Pools come from --env_service: a YAML file with `pools:` names them; otherwise (a flag value, or a YAML
file with `endpoints:`) there is one pool per served env, named after the env. Without --env_service,
each pool a task needs is an env built in-process from the env registry: the env named by
--local_pools (`sim=CartPole-v1,reward=ObsReward-v0`), or the pool's own name.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
from dataclasses import dataclass

from sf_core.envs.registry import registry_snapshot
from sf_core.config import ConfigError
from sf_core.evaluation.task_runners import runners_snapshot
from sf_core.evaluation.tasks import EvalError, check_tasks
from sf_core.evaluation.worker import WorkerSpec
from sf_core.service.endpoints import (
    Endpoint,
    ServiceConfigError,
    answers_with_capacity,
    describe,
    fleet_skipped,
    parse_pools,
    parse_service,
)
from sf_core.service.elastic import fleet_source
from sf_core.service.env_pool import EnvPool
from sf_core.service.fleet_file import load_fleet
from sf_core.service.remote_env import close_context
from sf_core.service.skip import is_skip


@dataclass
class Plan:
    pools: dict[str, EnvPool]  # the pools the tasks need; empty when envs are built in-process
    specs: list[WorkerSpec]
    inline: bool  # --num_workers=0: the runners are threads of the coordinator

    def describe(self, tasks: int) -> str:
        runners = self.specs[0].runners
        where = "inline on the coordinator" if self.inline else f"on {len(self.specs)} workers"
        text = f"{tasks} tasks {where} × {runners} task runners"
        if not self.pools:
            return text + " (envs built in-process)"
        slots = sum(len(p.slots) for p in self.pools.values())
        text += " (" + ", ".join(f"pool {name}: {len(p.slots)} slots" for name, p in self.pools.items()) + ")"
        total = runners * len(self.specs)
        if total > slots:  # not an error: runners without a slot wait for one, in line
            text += f"; {total} runners for {slots} slots: at most {slots} tasks run at once"
        return text


def make_plan(args: argparse.Namespace, tasks: list[dict]) -> Plan:
    policy = policy_spec(args)
    runners = runners_snapshot()
    needed = list(dict.fromkeys(p for t in tasks for p in t["needs"]))
    local_envs, pools = None, {}
    if is_skip(args.env_service):  # a training feature: each rollout worker serves its own envs
        raise EvalError(f"--env_service={args.env_service}: skip mode is for training; the evaluator runs the same "
                        f"tasks on in-process envs without --env_service (--local_pools=POOL=ENV,... names them)")
    in_process, fleet_modules = fleet_in_process(args.env_service) or (None, ())
    if in_process is not None and args.local_pools:
        raise EvalError(f"--local_pools names in-process envs; {args.env_service} names them already (skip: true)")
    if args.env_service and in_process is None:
        if args.local_pools:
            raise EvalError("--local_pools names the in-process envs of a run without --env_service; "
                            "with --env_service the pools come from the servers")
        endpoints = service_pools(args.env_service, args.env_service_timeout, tasks, set(runners))
        pools = {name: EnvPool([(e.address, i) for e in endpoints[name][1] for i in range(e.capacity)],
                               endpoints[name][0], args.env_service_timeout, args.env_service_recheck_interval)
                 for name in needed}
        for name, pool in pools.items():  # on a fleet file: slots added and drained while it runs
            if (source := fleet_source(args.env_service, name, endpoints[name][1])) is not None:
                pool.follow(source)
        slots = sum(len(p.slots) for p in pools.values())
        default_runners = math.ceil(slots / max(1, args.num_workers))  # enough for every slot to be busy
    else:
        check_tasks(tasks, None if in_process is None else set(in_process), set(runners),
                    f"no service of {args.env_service} provides")
        named = in_process if in_process is not None else parse_local_pools(args.local_pools)
        local_envs = {pool: named.get(pool, pool) for pool in needed}
        check_local_envs(local_envs)
        default_runners = 1  # in-process envs: the parallelism is the worker processes
    registry = registry_snapshot() if local_envs is not None else None
    modules = tuple(m.strip() for m in args.env_module.split(",") if m.strip()) + fleet_modules
    specs = [WorkerSpec(w, args.concurrency or default_runners, args.env_service_timeout, policy, runners,
                        local_envs, registry, modules) for w in range(max(1, args.num_workers))]
    return Plan(pools, specs, inline=args.num_workers == 0)


def fleet_in_process(value: str) -> tuple[dict[str, str], tuple[str, ...]] | None:
    """A fleet file whose every service has `skip: true`: ({pool: env} built in-process, as --local_pools
    says, and the services' env modules, imported here). A fleet of one service is the pool named after its
    env, as with servers. None for any other value. A fleet with some services skipped and others served is
    refused: the evaluator runs its tasks all on servers or all in-process."""
    try:
        fleet = load_fleet(value) if value and fleet_skipped(value) else None
    except ServiceConfigError as exc:
        raise EvalError(str(exc)) from None
    if fleet is None:
        return None
    skipped = fleet.skipped()
    if len(skipped) < len(fleet.services):
        raise EvalError(f"--env_service={value}: service {', '.join(skipped)} has skip: true and the others do not; "
                        f"the evaluator runs every pool on servers, or every pool in-process (all skip: true)")
    modules = tuple(dict.fromkeys(m.strip() for s in fleet.services.values() for m in s.env_module.split(",")
                                  if m.strip()))
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EvalError(f"{value}: env_module {module}: {exc}") from None
    pools = {env: env for env in skipped.values()} if len(skipped) == 1 else skipped
    return pools, modules


def service_pools(value: str, timeout: float, tasks: list[dict], runners: set[str]
                  ) -> dict[str, tuple[str, list[Endpoint]]]:
    """pool name -> (the env its servers serve, its endpoints), every address asked what it serves."""
    try:
        named = parse_pools(value)
        if named is not None:  # the pool names are known without asking: bad tasks stop here
            check_tasks(tasks, set(named), runners, f"no pool of {value} provides")
            endpoints = [e for pool in named.values() for e in pool]
        else:
            endpoints = parse_service(value)
        answers = answers_with_capacity(endpoints, timeout)
    except ServiceConfigError as exc:
        raise EvalError(str(exc)) from None
    finally:
        close_context()  # the workers are started next
    if named is None:
        named = {}
        for e in endpoints:
            named.setdefault(answers[e.address]["env"], []).append(e)
        served = ", ".join(f"{env} ({len(e)} addresses)" for env, e in named.items())
        check_tasks(tasks, set(named), runners, f"no server in --env_service serves (they serve {served})")
    return {name: (_pool_env(name, pool, answers), pool) for name, pool in named.items()}


def _pool_env(name: str, endpoints: list[Endpoint], answers: dict[str, dict]) -> str:
    """The env a pool's servers serve: one env, with the same spaces, at every address of the pool."""
    first = answers[endpoints[0].address]
    for e in endpoints[1:]:
        d = answers[e.address]
        if (d["env"], d["observation_space"], d["action_space"]) != (
                first["env"], first["observation_space"], first["action_space"]):
            raise EvalError(f"pool {name}: {e.address} serves {d['env']!r} and {endpoints[0].address} serves "
                            f"{first['env']!r}, with other spaces; a pool's slots must be interchangeable "
                            f"({describe(endpoints)})")
    return first["env"]


def check_local_envs(local_envs: dict[str, str]) -> None:
    """Build each in-process env once, here: a name nobody registered stops the run before it starts
    (an env that is costly to build is as costly in every runner)."""
    from sf_core.envs.registry import EnvContext, make_env
    from sf_core.config import Config

    for pool, name in local_envs.items():
        try:
            make_env(name, Config(env=name), EnvContext(worker_index=0, env_index=0, seed=0)).close()
        except Exception as exc:  # noqa: BLE001 - whatever the factory raises is the user's message
            what = f"pool {pool!r} (--local_pools: env {name!r})" if pool != name else f"env {name!r}"
            raise EvalError(f"{what} cannot be built in-process without --env_service: {exc}") from None


def parse_local_pools(value: str) -> dict[str, str]:
    """`sim=CartPole-v1,reward=ObsReward-v0` -> {pool: env name}."""
    pools = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        pool, eq, env = (s.strip() for s in item.partition("="))
        if not eq or not pool or not env:
            raise EvalError(f"--local_pools: {item!r} is not pool=env (e.g. sim=CartPole-v1)")
        pools[pool] = env
    return pools


def policy_spec(args: argparse.Namespace) -> dict:
    if not args.experiment:
        return {"kind": "random"}
    path = os.path.join(args.train_dir or "train_dir", args.experiment)
    # chosen once here, so every worker acts with the same policy of a run of several
    index = check_policy(path, args.checkpoint, args.policy_index)
    return {"kind": "checkpoint", "path": path, "checkpoint": args.checkpoint,
            "deterministic": args.eval_deterministic, "policy_index": index}


def check_policy(experiment_path: str, which: str, policy_index: int | None = None) -> int | None:
    """The index of the policy that will act (the best one unless `policy_index` names one). A missing
    experiment, policy or checkpoint, or an unregistered custom model part, stops the run here, not in
    every worker."""
    # imported here: it brings torch, which the coordinator needs only when a trained policy acts
    from sf_core.evaluation.policy import locate_checkpoint

    try:
        return locate_checkpoint(experiment_path, which, policy_index)[3]
    except ConfigError as exc:
        raise EvalError(str(exc)) from None
