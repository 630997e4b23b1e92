"""One evaluator worker (see sf_core/evaluation/evaluator.py): task runner threads that ask the coordinator for
work and run each task on the slots it was leased with it.

A runner says it is ready; the coordinator (the slot broker, sf_core/evaluation/slot_broker.py) answers with
a task and the lease of one slot per pool the task needs. The runner connects to those slots (one
connection per slot and runner thread, kept between tasks), runs the task's runner function on them
(sf_core/evaluation/task_runners.py), restores every slot to its initial snapshot, and reports the attempt:
its returns, or its error and which slot failed, if one did. Without env services the "slots" are envs
built in-process from the env registry, restored the way a server restores its instances.

The same code runs in a worker process (`worker_main`) or, with --num_workers=0, in threads of the
coordinator itself (`inline=True`).
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from queue import Empty
from typing import Any, Callable

import gymnasium as gym

from sf_core.envs.registry import EnvContext, EnvRegistry
from sf_core.evaluation.task_folders import start_attempt
from sf_core.evaluation.task_runners import Actor, TaskPolicy
from sf_core.service.env_pool import server_answers
from sf_core.service.remote_env import RemoteEnv, ServiceError, ServiceTimeout

log = logging.getLogger("sf_core")


@dataclass
class WorkerSpec:
    """Everything a worker needs, picklable."""

    worker: int
    runners: int  # task runner threads
    timeout: float  # per request to a server
    policy: dict  # {"kind": "random"} or {"kind": "checkpoint", "path": experiment folder, "checkpoint": ..,
    #              "deterministic": .., "policy_index": which policy of the run}
    task_runners: dict[str, Callable] = field(default_factory=dict)
    local_envs: dict[str, str] | None = None  # pool -> env name, built in-process; None: leased slots
    registry: EnvRegistry | None = None  # builds the in-process envs
    env_modules: tuple[str, ...] = ()


class Actors:
    """How to act in each pool's env: random actions, or the experiment's trained policy (one copy of
    the weights per pool, shared by the runner threads, each episode with its own recurrent state)."""

    def __init__(self, spec: dict):
        self.spec, self.lock, self.trained = spec, threading.Lock(), {}
        self.loaded = None
        if spec["kind"] == "checkpoint":
            import torch

            from sf_core.evaluation.policy import load_checkpoint

            torch.set_num_threads(1)  # one thread per runner thread: they share the cores
            self.loaded = load_checkpoint(spec["path"], spec["checkpoint"], policy_index=spec.get("policy_index"))

    def actor_for(self, pool: str, env: gym.Env) -> Actor:
        if self.loaded is None:
            # this runner's own env's space: a space seeded by two threads at once would mix their draws
            space = env.action_space
            return lambda rng: lambda obs: _sample(space, rng)
        with self.lock:
            if pool not in self.trained:
                policy = self.loaded.policy(env.observation_space, env.action_space, bool(self.spec.get("deterministic")))

                def start(rng, policy=policy):
                    episode = policy.start_episode()  # this task's own recurrent state; the model is shared
                    return lambda obs: policy.act([obs], episode)[0]
                self.trained[pool] = start
            return self.trained[pool]


def _sample(space: gym.Space, rng) -> Any:
    space.seed(int(rng.integers(2**31)))  # reproducible per task, whichever slot or thread runs it
    return space.sample()


class LeasedEnv(gym.Wrapper):
    """The env on one leased slot, as the task runner sees it; remembers the service error that lost it
    even if the runner catches it."""

    def __init__(self, env: gym.Env, slot: str):
        super().__init__(env)
        self.slot, self.error = slot, None

    def reset(self, **kwargs):
        return self._call(self.env.reset, **kwargs)

    def step(self, action):
        return self._call(self.env.step, action)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ServiceError as exc:
            self.error = self.error or exc
            raise


class RunnerEnvs:
    """One runner thread's connections to slots (or in-process envs), kept from task to task."""

    def __init__(self, spec: WorkerSpec, index: int):
        self.spec, self.index, self.envs = spec, index, {}

    def lease(self, task: dict, envs: dict[str, LeasedEnv], failed: dict[str, dict]) -> None:
        """Fill `envs` with the task's envs by pool, and `failed` with the slots that could not be reached
        (filled as it goes: an env that cannot be built in-process raises, and what was leased goes back)."""
        for pool in task["needs"]:
            slot = task["lease"].get(pool) or f"local:{pool}"
            try:
                envs[pool] = LeasedEnv(self._env(pool, slot), slot)
            except ServiceError as exc:
                failed[pool] = _failure(slot, exc)

    def _env(self, pool: str, slot: str) -> gym.Env:
        if slot not in self.envs:
            if self.spec.local_envs is None:
                address, index = slot.rsplit("#", 1)
                self.envs[slot] = RemoteEnv(address, int(index), self.spec.timeout)
            else:
                name = self.spec.local_envs[pool]
                # built as a server started with the default --seed=0 builds its instance `index`: the same
                # task gives the same results with and without the server
                ctx = EnvContext(worker_index=self.spec.worker, env_index=self.index, seed=self.index)
                self.envs[slot] = self.spec.registry.make(name, _config(name), ctx)
        return self.envs[slot]

    def give_back(self, envs: dict[str, LeasedEnv], failed: dict[str, dict]) -> None:
        """Restore every slot that did not fail (adding to `failed` those whose restore fails)."""
        for pool, leased in envs.items():
            if leased.error is not None:
                failed.setdefault(pool, _failure(leased.slot, leased.error))
                self._drop(leased.slot)
                continue
            env = leased.env
            try:
                if isinstance(env, RemoteEnv):
                    env.restore()
                elif hasattr(env, "restore_snapshot"):  # the env server's rule, for an in-process env
                    env.restore_snapshot()
                else:
                    self._drop(leased.slot)  # a fresh instance next time
            except Exception as exc:  # noqa: BLE001 - a runner thread must outlive an env that cannot restore
                self._drop(leased.slot)  # in-process: a fresh instance next time, nothing is out of service
                if isinstance(exc, ServiceError):
                    failed[pool] = _failure(leased.slot, exc)

    def _drop(self, slot: str) -> None:
        env = self.envs.pop(slot, None)
        if env is not None:
            env.close()

    def close(self) -> None:
        for slot in list(self.envs):
            self._drop(slot)


def _config(env: str):
    from sf_core.config import Config

    return Config(env=env)


def _failure(slot: str, exc: Exception) -> dict:
    # a timeout: is the server gone (its other slots too) or only this instance stuck? Asked here, so the
    # coordinator's loop never waits on a server
    down = isinstance(exc, ServiceTimeout) and not slot.startswith("local:") and not server_answers(slot.rsplit("#", 1)[0])
    return {"slot": slot, "error": f"{type(exc).__name__}: {exc}", "server_down": down}


def run_task(task: dict, envs: RunnerEnvs, actors: Actors, runners: dict[str, Callable]) -> dict:
    """One attempt of one task on its leased slots; its outcome (never raises)."""
    started = time.time()
    outcome: dict[str, Any] = {"returns": [], "lengths": [], "error": None, "retryable": False}
    leased: dict[str, LeasedEnv] = {}
    failed: dict[str, dict] = {}
    try:
        if task.get("folder"):
            start_attempt(task["folder"])  # empty: nothing of a failed attempt is mixed in
        envs.lease(task, leased, failed)
        if not failed:
            returns, lengths = runners[task["runner"]](leased, task, TaskPolicy(actors.actor_for, leased, task["seed"]))
            outcome.update(returns=[float(r) for r in returns], lengths=[int(n) for n in lengths])
    except Exception as exc:  # noqa: BLE001 - the task itself is broken unless a slot failed (below)
        outcome["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    outcome["slots"] = {pool: e.slot for pool, e in leased.items()} | {p: f["slot"] for p, f in failed.items()}
    envs.give_back(leased, failed)
    lost = [p for p in task["needs"] if p in failed and (p not in leased or leased[p].error is not None)]
    if lost:  # the slot (or its service) failed: another slot may do it
        outcome.update(error=failed[lost[0]]["error"], retryable=True, returns=[], lengths=[])
    outcome["failed"] = failed  # restores that failed too: those slots are out of service, the result stands
    outcome["started"], outcome["ended"] = started, time.time()
    return outcome


def serve(spec: WorkerSpec, index: int, actors: Actors, inbox, results, stop) -> None:
    """One runner thread: ready, a task, its attempt, ready again; None in the inbox ends it."""
    envs, parent = RunnerEnvs(spec, index), multiprocessing.parent_process()
    try:
        while not stop.is_set():
            results.put({"kind": "ready", "worker": spec.worker})
            task = None
            while task is None and not stop.is_set():
                try:
                    task = inbox.get(timeout=0.2)
                    if task is None:
                        return
                except Empty:
                    if parent is not None and not parent.is_alive():
                        return  # the coordinator was killed outright: do not linger as an orphan
            if task is not None:
                outcome = run_task(task, envs, actors, spec.task_runners)
                results.put({"kind": "attempt", "worker": spec.worker, "id": task["id"], **outcome})
    finally:
        envs.close()


def worker_main(spec: WorkerSpec, inbox, results, stop, inline: bool = False) -> None:
    """Entry of a worker process (or, inline, of a thread of the coordinator): `inbox` (tasks, None = no
    more), `results` (ready, attempts), `stop` (an Event: take no new task)."""
    if not inline:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the coordinator decides
    try:
        for module in spec.env_modules:
            importlib.import_module(module)
        actors = Actors(spec.policy)
    except Exception as exc:  # noqa: BLE001 - reported, the coordinator stops
        results.put({"kind": "worker_error", "worker": spec.worker, "error": f"{type(exc).__name__}: {exc}"})
        return
    threads = [threading.Thread(target=serve, args=(spec, i, actors, inbox, results, stop), name=f"task_runner_{i}",
                                daemon=True) for i in range(spec.runners)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put({"kind": "worker_done", "worker": spec.worker})
