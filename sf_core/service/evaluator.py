"""`python -m sf_core.evaluate --tasks=tasks.jsonl --num_workers=N --env_service=...`: run evaluation tasks
on pooled env slots and write one result line per task.

A task is one JSON line: `{"id": "t1", "env": "CartPole-v1", "seed": 3, "episodes": 2, "options": {...}}`
(`id` defaults to the line number, `env` to --env, `seed` to null, `episodes` to 1; `options` is the
scenario, passed to the env's `reset(options=...)`; episode k of a task is seeded seed + k).

The coordinator (this process) asks every address in --env_service which env it serves, divides each
env's slots among N worker processes in contiguous slices (sf_core/service/eval_worker.py), queues the tasks
and writes each result line as soon as the task is final, so an interrupted run keeps every finished
result (and `--resume` skips them next time). An attempt that fails on a broken slot or a service that
is down is queued again, up to --max_task_retries times, and a worker with a free healthy slot runs it:
not on the slot that failed, which its pool has taken out of service. Ctrl-C or SIGTERM: workers
finish the tasks in their hands for --grace_period seconds, then are killed.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import signal
import time
from queue import Empty

from sf_core.config import ConfigError
from sf_core.service.endpoints import (
    Endpoint,
    ServiceConfigError,
    parse_service,
    probe,
    worker_slice,
)
from sf_core.service.eval_worker import WorkerSpec, worker_main
from sf_core.service.remote_env import close_context

log = logging.getLogger("sf_core")

EXIT_OK, EXIT_FAILED_TASKS, EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 130, 143


class EvalError(ValueError):
    """Bad flags, tasks or services: reported before any worker starts (exit code 2)."""


# ------------------------------------------------------------------ tasks


def load_tasks(path: str, default_env: str) -> list[dict]:
    if not os.path.isfile(path):
        raise EvalError(f"--tasks={path}: no such file")
    tasks, ids = [], set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise EvalError(f"{path}:{n}: not JSON ({exc})") from None
            if not isinstance(raw, dict):
                raise EvalError(f"{path}:{n}: a task must be a JSON object")
            task = {"id": str(raw.get("id", n)), "env": raw.get("env", default_env), "seed": raw.get("seed"),
                    "episodes": raw.get("episodes", 1), "options": raw.get("options")}
            if not task["env"] or not isinstance(task["env"], str):
                raise EvalError(f"{path}:{n}: task {task['id']} names no env (and there is no --env)")
            if not isinstance(task["episodes"], int) or task["episodes"] < 1:
                raise EvalError(f"{path}:{n}: episodes must be a positive integer")
            if task["seed"] is not None and (not isinstance(task["seed"], int) or task["seed"] < 0):
                raise EvalError(f"{path}:{n}: seed must be a non-negative integer or null")
            if task["options"] is not None and not isinstance(task["options"], dict):
                raise EvalError(f"{path}:{n}: options must be a JSON object")
            if task["id"] in ids:
                raise EvalError(f"{path}:{n}: task id {task['id']!r} appears twice")
            ids.add(task["id"])
            tasks.append(task)
    if not tasks:
        raise EvalError(f"{path}: no tasks")
    return tasks


def finished_ids(output: str) -> set[str]:
    done = set()
    if os.path.exists(output):
        with open(output, encoding="utf-8") as f:
            for line in f:
                try:
                    done.add(json.loads(line)["id"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut by a hard kill: that task runs again
    return done


# ------------------------------------------------------------------ services and workers


def discover(env_service: str, timeout: float) -> dict[str, list[Endpoint]]:
    """env name -> the endpoints serving it, asking every address what it serves."""
    try:
        endpoints = parse_service(env_service)
        answers, silent = probe(endpoints, timeout)
    except ServiceConfigError as exc:
        raise EvalError(str(exc)) from None
    finally:
        close_context()  # the workers are started next
    if silent:
        raise EvalError("env servers did not answer: " + "; ".join(silent))
    by_env: dict[str, list[Endpoint]] = {}
    for e in endpoints:
        served = answers[e.address]
        if served["capacity"] < e.capacity:
            raise EvalError(f"--env_service lists {e} but that server has only {served['capacity']} slots")
        by_env.setdefault(served["env"], []).append(e)
    return by_env


def plan_workers(args: argparse.Namespace, by_env: dict[str, list], needed: set[str]) -> list[WorkerSpec]:
    missing = sorted(needed - set(by_env))
    if missing:
        served = ", ".join(f"{env} ({len(e)} addresses)" for env, e in by_env.items()) or "nothing"
        raise EvalError(f"tasks need {', '.join(missing)}, which no server in --env_service serves (they serve {served})")
    W = args.num_workers
    for env in needed:
        total = sum(e.capacity for e in by_env[env])
        if total < W:
            raise EvalError(f"{env}: {' + '.join(map(str, by_env[env]))} = {total} slots but --num_workers={W}: "
                            f"each worker needs at least one slot of every env its tasks use ({total} < {W})")
    if args.experiment:
        path = os.path.join(args.train_dir or "train_dir", args.experiment)
        # chosen once here, so every worker acts with the same policy of a run of several
        index = check_policy(path, args.checkpoint, args.policy_index)
        policy = {"kind": "checkpoint", "path": path, "checkpoint": args.checkpoint,
                  "deterministic": args.eval_deterministic, "policy_index": index}
    else:
        policy = {"kind": "random"}
    specs = []
    for w in range(W):
        slots = {env: [(f"{s.host}:{s.port}", s.index) for s in worker_slice(by_env[env], W, w)] for env in needed}
        concurrency = min(len(s) for s in slots.values())  # the smallest pool it needs
        if args.concurrency > 0:
            concurrency = min(concurrency, args.concurrency)
        specs.append(WorkerSpec(w, slots, concurrency, args.env_service_timeout, args.env_service_recheck_interval,
                                args.acquire_timeout, policy))
    return specs


def check_policy(experiment_path: str, which: str, policy_index: int | None = None) -> int | None:
    """The index of the policy that will act (the best one unless `policy_index` names one). A missing
    experiment, policy or checkpoint, or an unregistered custom model part, stops the run here, not in
    every worker."""
    # imported here: it brings torch, which the coordinator needs only when a trained policy acts
    from sf_core.policy import locate_checkpoint

    try:
        return locate_checkpoint(experiment_path, which, policy_index)[3]
    except ConfigError as exc:
        raise EvalError(str(exc)) from None


# ------------------------------------------------------------------ coordination


class Coordinator:
    def __init__(self, args: argparse.Namespace, tasks: list[dict], specs: list[WorkerSpec], output: str):
        self.args, self.specs, self.output = args, specs, output
        self.tasks = {t["id"]: t for t in tasks}
        self.attempts: dict[str, list[dict]] = {t["id"]: [] for t in tasks}
        self.in_hands: dict[int, set[str]] = {s.worker: set() for s in specs}  # started, not finished
        self.written = self.failed = 0
        self.stop_signal: int | None = None
        ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no inherited threads or sockets
        self.task_queue, self.results, self.stop = ctx.Queue(), ctx.Queue(), ctx.Event()
        self.procs = {s.worker: ctx.Process(target=worker_main, args=(s, self.task_queue, self.results, self.stop),
                                            name=f"eval_worker_{s.worker}", daemon=True) for s in specs}
        self.alive = set(self.procs)

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
            log.warning("received %s: finishing the tasks in hand (up to %gs), then stopping",
                        signal.Signals(signum).name, self.args.grace_period)

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            with open(self.output, "a", encoding="utf-8") as out:
                self.out = out
                for proc in self.procs.values():
                    proc.start()
                for task in self.tasks.values():
                    self.task_queue.put(task)
                while self.tasks and self.stop_signal is None and self.alive:
                    self._collect(timeout=0.2)
                self._wind_down()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for q in (self.task_queue, self.results):
                q.cancel_join_thread()  # tasks nobody will take must not hold this process at exit
                q.close()
        unfinished = len(self.tasks)
        log.info("%d results written to %s (%d failed)%s", self.written, self.output, self.failed,
                 f"; {unfinished} tasks not finished" if unfinished else "")
        if self.stop_signal is not None:
            return EXIT_SIGINT if self.stop_signal == signal.SIGINT else EXIT_SIGTERM
        return EXIT_FAILED_TASKS if self.failed or unfinished else EXIT_OK

    def _collect(self, timeout: float) -> None:
        try:
            msg = self.results.get(timeout=timeout)
        except Empty:
            self._check_workers()
            return
        kind, worker = msg["kind"], msg["worker"]
        if kind == "started":
            self.in_hands[worker].add(msg["id"])
        elif kind == "attempt":
            self.in_hands[worker].discard(msg["id"])
            self._attempt_done(msg)
        elif kind == "worker_error":
            log.error("eval worker %d could not start: %s", worker, msg["error"])
            self.alive.discard(worker)
        elif kind == "worker_done":
            self.alive.discard(worker)

    def _check_workers(self) -> None:
        """A worker process that died takes its tasks in hand with it: they are attempts that failed."""
        for w in list(self.alive):
            if not self.procs[w].is_alive():
                self.alive.discard(w)
                log.error("eval worker %d died (exit code %s)", w, self.procs[w].exitcode)
                for task_id in self.in_hands[w]:
                    self._attempt_done({"id": task_id, "worker": w, "slot": None, "returns": [], "lengths": [],
                                        "error": "the worker process died", "retryable": True, "seconds": 0.0})
                self.in_hands[w].clear()

    def _attempt_done(self, msg: dict) -> None:
        task_id = msg["id"]
        if task_id not in self.tasks:
            return
        attempts = self.attempts[task_id]
        attempts.append({"worker": msg["worker"], "slot": msg["slot"], "error": msg["error"],
                         "seconds": round(msg["seconds"], 3)})
        if msg["error"] is None:
            self._write(task_id, "ok", msg)
        elif msg["retryable"] and self.stop_signal is not None:
            return  # stopping: left without a line, so --resume runs it again
        elif msg["retryable"] and len(attempts) <= self.args.max_task_retries:
            log.warning("task %s failed on %s (%s): retrying (%d of %d)", task_id, msg["slot"], msg["error"],
                        len(attempts), self.args.max_task_retries)
            failed_on = [a["slot"] for a in attempts if a["slot"]]
            self.task_queue.put({**self.tasks[task_id], "avoid": failed_on})  # elsewhere, if possible
        else:
            self._write(task_id, "failed", msg)

    def _write(self, task_id: str, status: str, msg: dict) -> None:
        task = self.tasks.pop(task_id)
        attempts = self.attempts.pop(task_id)
        returns, lengths = msg["returns"], msg["lengths"]
        line = {"id": task_id, "env": task["env"], "seed": task["seed"], "options": task["options"],
                "episodes": task["episodes"], "status": status, "returns": returns, "lengths": lengths,
                "mean_return": sum(returns) / len(returns) if returns and status == "ok" else None,
                "slot": msg["slot"], "worker": msg["worker"], "failures": sum(a["error"] is not None for a in attempts),
                "attempts": attempts}
        if "policy_index" in self.specs[0].policy:  # a trained policy acted: which one of its run
            line["policy_index"] = self.specs[0].policy["policy_index"]
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()  # a finished result survives whatever happens next
        self.written += 1
        self.failed += status == "failed"
        if self.written % 10 == 0 or not self.tasks:
            log.info("%d results written, %d tasks left", self.written, len(self.tasks))

    def _wind_down(self) -> None:
        """Normal end: release the workers. Interrupted: the tasks in hand get the grace period."""
        if self.stop_signal is not None:
            self.stop.set()  # task threads take no new task; the ones in hand may finish
        for _ in range(sum(s.concurrency for s in self.specs)):
            self.task_queue.put(None)
        deadline = time.time() + (self.args.grace_period if self.stop_signal is not None else 30.0)
        while self.alive and time.time() < deadline:
            self._collect(timeout=0.2)
        for w, proc in self.procs.items():
            proc.join(timeout=max(0.0, deadline - time.time()))  # a worker that said goodbye is exiting
            if proc.is_alive():
                log.warning("eval worker %d did not stop in time: killing it", w)
                proc.kill()
                proc.join(timeout=5)
