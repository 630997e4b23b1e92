"""`python -m sf_core.evaluate --tasks=tasks.jsonl [--env_service=...] [--num_workers=N]`: run evaluation tasks
on pooled env slots (or in-process envs) and write one result line per task.

The coordinator (this process) is the slot broker (sf_core/evaluation/slot_broker.py): it owns the slot
table, and hands each task to an idle task runner together with the lease of the slots it needs, all or
none, in FIFO order. Runners are threads of N worker processes (sf_core/evaluation/worker.py) or, with
--num_workers=0, of this process. The coordinator writes each result line as soon as the task is final,
so an interrupted run keeps every finished result (and `--resume` skips them next time). An attempt that
fails on a broken slot or a service that is down is queued again, up to --max_task_retries times, and
preferably leased other slots; the failed slot is out of service until a health check re-admits it.
Ctrl-C or SIGTERM: runners finish the tasks in their hands for --grace_period seconds, then the workers
are killed.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from queue import Empty

from sf_core.evaluation.plan import Plan, check_policy
from sf_core.evaluation.slot_broker import SlotBroker
from sf_core.evaluation.task_folders import task_folder, write_result
from sf_core.evaluation.tasks import EvalError, finished_ids, load_tasks
from sf_core.evaluation.worker import worker_main

__all__ = ["Coordinator", "EvalError", "check_policy", "finished_ids", "load_tasks"]

log = logging.getLogger("sf_core")

EXIT_OK, EXIT_FAILED_TASKS, EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 130, 143


class Coordinator:
    def __init__(self, args: argparse.Namespace, tasks: list[dict], plan: Plan, output: str):
        self.args, self.specs, self.output = args, plan.specs, output
        self.output_dir = getattr(args, "output_dir", "") or os.path.splitext(output)[0]  # task folders
        self.tasks = {t["id"]: t for t in tasks}
        self.attempts: dict[str, list[dict]] = {t["id"]: [] for t in tasks}
        self.in_hands: dict[int, set[str]] = {s.worker: set() for s in plan.specs}  # assigned, not finished
        self.broker = SlotBroker(plan.pools, args.acquire_timeout)
        self.written = self.failed = 0
        self.stop_signal: int | None = None
        if plan.inline:  # threads of this process: plain queues, and no process to kill
            self.results, self.stop = queue.Queue(), threading.Event()
            self.inboxes = {s.worker: queue.Queue() for s in plan.specs}
            self.procs = {s.worker: threading.Thread(target=worker_main, name="inline_eval_worker", daemon=True,
                                                     args=(s, self.inboxes[s.worker], self.results, self.stop, True))
                          for s in plan.specs}
        else:
            ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no inherited threads or sockets
            self.results, self.stop = ctx.Queue(), ctx.Event()
            self.inboxes = {s.worker: ctx.Queue() for s in plan.specs}
            self.procs = {s.worker: ctx.Process(target=worker_main, name=f"eval_worker_{s.worker}", daemon=True,
                                                args=(s, self.inboxes[s.worker], self.results, self.stop))
                          for s in plan.specs}
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
                    self.broker.submit(task)
                while self.tasks and self.stop_signal is None and self.alive:
                    self._collect(timeout=0.2)
                    self._dispatch()
                self._wind_down()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for q in (self.results, *self.inboxes.values()):
                if hasattr(q, "cancel_join_thread"):
                    q.cancel_join_thread()  # tasks nobody will take must not hold this process at exit
                    q.close()
            self.broker.close()
        unfinished = len(self.tasks)
        log.info("%d results written to %s (%d failed)%s", self.written, self.output, self.failed,
                 f"; {unfinished} tasks not finished" if unfinished else "")
        if self.stop_signal is not None:
            return EXIT_SIGINT if self.stop_signal == signal.SIGINT else EXIT_SIGTERM
        return EXIT_FAILED_TASKS if self.failed or unfinished else EXIT_OK

    def _dispatch(self) -> None:
        assigned, starved = self.broker.dispatch(time.monotonic())
        for worker, task, lease in assigned:
            self.in_hands[worker].add(task["id"])
            folder = task_folder(self.output_dir, task["id"])
            self.inboxes[worker].put({**task, "lease": lease, "folder": folder})
        for task, why in starved:
            self._attempt_done({"id": task["id"], "worker": None, "slots": {}, "returns": [], "lengths": [],
                                "error": why, "retryable": True, "started": time.time(), "ended": time.time()})

    def _collect(self, timeout: float) -> None:
        try:
            msg = self.results.get(timeout=timeout)
        except Empty:
            self._check_workers()
            return
        kind, worker = msg["kind"], msg["worker"]
        if kind == "ready":
            self.broker.runner_ready(worker)
        elif kind == "attempt":
            self.in_hands[worker].discard(msg["id"])
            self.broker.release(msg["id"], msg["failed"])
            self._attempt_done(msg)
        elif kind == "worker_error":
            log.error("eval worker %d could not start: %s", worker, msg["error"])
            self.alive.discard(worker)
        elif kind == "worker_done":
            self.alive.discard(worker)

    def _check_workers(self) -> None:
        """A worker process that died takes its tasks in hand with it: they are attempts that failed, and
        their slots, in an unknown state, go to the health checks (which restore them)."""
        for w in list(self.alive):
            if not self.procs[w].is_alive():
                self.alive.discard(w)
                self.broker.forget_worker(w)
                log.error("eval worker %d died (exit code %s)", w, getattr(self.procs[w], "exitcode", None))
                for task_id in self.in_hands[w]:
                    slots = self.broker.forfeit(task_id, "its task runner's process died")
                    self._attempt_done({"id": task_id, "worker": w, "slots": slots,
                                        "returns": [], "lengths": [], "error": "the worker process died",
                                        "retryable": True, "started": time.time(), "ended": time.time()})
                self.in_hands[w].clear()

    def _attempt_done(self, msg: dict) -> None:
        task_id = msg["id"]
        if task_id not in self.tasks:
            return
        attempts = self.attempts[task_id]
        slots = msg["slots"]
        failed_slots = [f["slot"] for f in msg.get("failed", {}).values()] if msg["error"] else []
        if msg["error"] and msg["retryable"] and "failed" not in msg:
            failed_slots = list(slots.values())  # its worker died holding them
        attempts.append({"worker": msg["worker"], "slot": next(iter(slots.values()), None), "slots": slots,
                         "error": msg["error"], "failed_slots": failed_slots,
                         "seconds": round(msg["ended"] - msg["started"], 3),
                         "started": round(msg["started"], 4), "ended": round(msg["ended"], 4)})
        if msg["error"] is None:
            self._write(task_id, "ok", msg)
        elif msg["retryable"] and self.stop_signal is not None:
            return  # stopping: left without a line, so --resume runs it again
        elif msg["retryable"] and len(attempts) <= self.args.max_task_retries:
            log.warning("task %s failed on %s (%s): retrying (%d of %d)", task_id, ", ".join(failed_slots) or "-",
                        msg["error"], len(attempts), self.args.max_task_retries)
            avoid = sorted({slot for a in attempts for slot in a["failed_slots"]})
            self.broker.submit({**self.tasks[task_id], "avoid": avoid})  # other slots, if the pool has them
        else:
            self._write(task_id, "failed", msg)

    def _write(self, task_id: str, status: str, msg: dict) -> None:
        task = self.tasks.pop(task_id)
        attempts = self.attempts.pop(task_id)
        returns, lengths = msg["returns"], msg["lengths"]
        line = {"id": task_id, "env": task["env"], "needs": task["needs"], "runner": task["runner"],
                "seed": task["seed"], "options": task["options"], "episodes": task["episodes"], "status": status,
                "returns": returns, "lengths": lengths,
                "mean_return": sum(returns) / len(returns) if returns and status == "ok" else None,
                "slot": attempts[-1]["slot"], "slots": msg["slots"], "worker": msg["worker"],
                "failures": sum(a["error"] is not None for a in attempts), "attempts": attempts}
        if "policy_index" in self.specs[0].policy:  # a trained policy acted: which one of its run
            line["policy_index"] = self.specs[0].policy["policy_index"]
        write_result(task_folder(self.output_dir, task_id), line)  # the marker first: see task_folders
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()  # a finished result survives whatever happens next
        self.written += 1
        self.failed += status == "failed"
        if self.written % 10 == 0 or not self.tasks:
            log.info("%d results written, %d tasks left", self.written, len(self.tasks))

    def _wind_down(self) -> None:
        """Normal end: release the workers. Interrupted: the tasks in hand get the grace period."""
        if self.stop_signal is not None:
            self.stop.set()  # runners take no new task; the ones in hand may finish
        for spec in self.specs:
            for _ in range(spec.runners):
                self.inboxes[spec.worker].put(None)
        deadline = time.time() + (self.args.grace_period if self.stop_signal is not None else 30.0)
        while self.alive and time.time() < deadline:
            self._collect(timeout=0.2)
        for w, proc in self.procs.items():
            proc.join(timeout=max(0.0, deadline - time.time()))  # a worker that said goodbye is exiting
            if proc.is_alive() and hasattr(proc, "kill"):
                log.warning("eval worker %d did not stop in time: killing it", w)
                proc.kill()
                proc.join(timeout=5)
            elif proc.is_alive():  # inline runner threads are daemons: they end with this process
                log.warning("inline task runners did not stop in time: leaving them to the process exit")
