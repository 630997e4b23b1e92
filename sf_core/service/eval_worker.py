"""One evaluator worker process (see sf_core/evaluate.py): several tasks at once against pooled env slots.

The worker owns one pool per env name, over its contiguous slice of that env's slots, and runs
`concurrency` task threads (the size of its smallest pool, so no thread waits for a slot while the
service is healthy). A thread takes a task, acquires a slot (PooledEnv.reset), plays the task's
episodes, and gives the slot back restored to its initial snapshot. Every attempt, finished or failed,
goes back to the coordinator, which decides about retries and writes the result lines.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from queue import Empty
from typing import Any, Callable

import numpy as np

from sf_core.service.env_pool import EnvPool, PooledEnv
from sf_core.service.remote_env import ServiceError

log = logging.getLogger("sf_core")


@dataclass
class WorkerSpec:
    """Everything a worker process needs, picklable: its slots per env and how to act."""

    worker: int
    slots: dict[str, list[tuple[str, int]]]  # env name -> [(host:port, instance index)]
    concurrency: int
    timeout: float  # per request to a server
    recheck_interval: float
    acquire_timeout: float
    policy: dict  # {"kind": "random"} or {"kind": "checkpoint", "path": experiment folder, "checkpoint": ..,
    #              "policy_index": which policy of the run}


EpisodeActor = Callable[[Any], Any]  # observation -> action, for one episode
Actor = Callable[[np.random.Generator], EpisodeActor]  # starts an episode; the rng is the task's


def make_actors(spec: dict, spaces: dict[str, tuple]) -> dict[str, Actor]:
    """env name -> how to act in it: random actions, or the experiment's trained policy."""
    if spec["kind"] == "random":
        def random_actor(space) -> Actor:
            return lambda rng: lambda obs: _sample(space, rng)
        return {env: random_actor(action_space) for env, (_, action_space) in spaces.items()}

    import torch

    from sf_core.policy import TrainedPolicy, load_checkpoint

    torch.set_num_threads(1)  # one thread per task thread: the worker's threads share the cores
    loaded = load_checkpoint(spec["path"], spec["checkpoint"], policy_index=spec.get("policy_index"))

    def trained_actor(policy: TrainedPolicy) -> Actor:
        def start(rng: np.random.Generator) -> EpisodeActor:
            episode = policy.start_episode()  # this task's own recurrent state; the model is shared
            return lambda obs: policy.act([obs], episode)[0]
        return start
    # one policy (one copy of the weights) per env, built before the task threads start
    return {env: trained_actor(loaded.policy(obs_space, action_space, bool(spec.get("deterministic"))))
            for env, (obs_space, action_space) in spaces.items()}


def _sample(space, rng: np.random.Generator):
    space.seed(int(rng.integers(2**31)))  # reproducible per task, whichever slot or thread runs it
    return space.sample()


def run_task(task: dict, pool: EnvPool, actor: Actor, acquire_timeout: float) -> dict:
    """Play one task's episodes on one slot; the attempt's outcome (never raises)."""
    env = PooledEnv(pool, acquire_timeout, avoid=frozenset(task.get("avoid", ())))  # not where it failed
    outcome: dict[str, Any] = {"slot": None, "returns": [], "lengths": [], "error": None, "retryable": False}
    seed, options = task.get("seed"), task.get("options")
    rng = np.random.default_rng(seed)
    started = time.time()
    try:
        for episode in range(task["episodes"]):
            obs, _ = env.reset(seed=None if seed is None else seed + episode, options=options)
            outcome["slot"] = env.slot_name
            act = actor(rng)
            total, length, done = 0.0, 0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(act(obs))
                total, length, done = total + reward, length + 1, terminated or truncated
            outcome["returns"].append(total)
            outcome["lengths"].append(length)
    except ServiceError as exc:  # the slot (or the service) failed: another slot may do it
        outcome.update(error=f"{type(exc).__name__}: {exc}", retryable=True)
        outcome["slot"] = outcome["slot"] or env.slot_name
    except Exception as exc:  # noqa: BLE001 - the task itself is broken: report, do not retry
        outcome.update(error="".join(traceback.format_exception_only(type(exc), exc)).strip(), retryable=False)
    finally:
        env.close()  # back to the pool, restored to its initial snapshot
    outcome["seconds"] = time.time() - started
    return outcome


def worker_main(spec: WorkerSpec, tasks, results, stop) -> None:
    """Process entry: `tasks` (None = no more), `results` (attempt outcomes), `stop` (an Event)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the coordinator decides
    pools = {env: EnvPool(slots, env, spec.timeout, spec.recheck_interval) for env, slots in spec.slots.items()}
    try:
        spaces = {env: pool.spaces() for env, pool in pools.items()}
        actors = make_actors(spec.policy, spaces)
    except Exception as exc:  # noqa: BLE001 - reported, the coordinator stops
        results.put({"kind": "worker_error", "worker": spec.worker, "error": f"{type(exc).__name__}: {exc}"})
        return

    parent = multiprocessing.parent_process()

    def consume() -> None:
        while not stop.is_set():
            try:
                task = tasks.get(timeout=0.2)
            except Empty:
                if parent is not None and not parent.is_alive():
                    return  # the coordinator was killed outright: do not linger as an orphan
                continue
            if task is None:
                return
            results.put({"kind": "started", "worker": spec.worker, "id": task["id"]})
            outcome = run_task(task, pools[task["env"]], actors[task["env"]], spec.acquire_timeout)
            results.put({"kind": "attempt", "worker": spec.worker, "id": task["id"], **outcome})

    threads = [threading.Thread(target=consume, name=f"task_thread_{i}", daemon=True)
               for i in range(spec.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for pool in pools.values():
        pool.close()
    results.put({"kind": "worker_done", "worker": spec.worker})
