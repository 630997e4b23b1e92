"""The evaluator's task file: one JSON task per line, read and checked before anything starts.

    {"id": "t1", "env": "CartPole-v1", "seed": 3, "episodes": 2, "options": {"scenario": "rain"}}
    {"id": "t2", "needs": ["sim", "reward"], "runner": "sim_with_reward", "seed": 4, "episodes": 2}

`id` defaults to the line number, `env` to --env, `seed` to null, `episodes` to 1, `needs` to
[env] (one slot of the pool named after the env), `runner` to "episodes" (sf_core/evaluation/task_runners.py).
Other fields are kept: the task's runner gets the whole task.
"""

from __future__ import annotations

import json
import os

from sf_core.evaluation.task_runners import DEFAULT_RUNNER


class EvalError(ValueError):
    """Bad flags, tasks or services: reported before any worker starts (exit code 2)."""


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
            task = _task(raw, n, default_env, f"{path}:{n}")
            if task["id"] in ids:
                raise EvalError(f"{path}:{n}: task id {task['id']!r} appears twice")
            ids.add(task["id"])
            tasks.append(task)
    if not tasks:
        raise EvalError(f"{path}: no tasks")
    return tasks


def _task(raw: dict, n: int, default_env: str, where: str) -> dict:
    if "folder" in raw:
        raise EvalError(f"{where}: a task's folder is given by the evaluator (--output_dir/<task id>, as "
                        f"task[\"folder\"] to its runner); remove the task's \"folder\" field")
    task = {**raw, "id": str(raw.get("id", n)), "env": raw.get("env", default_env or None), "seed": raw.get("seed"),
            "episodes": raw.get("episodes", 1), "options": raw.get("options"),
            "runner": raw.get("runner", DEFAULT_RUNNER)}
    needs = raw.get("needs")
    if needs is None:
        if not task["env"] or not isinstance(task["env"], str):
            raise EvalError(f"{where}: task {task['id']} names no env (and there is no --env) and no needs")
        needs = [task["env"]]
    if not isinstance(needs, list) or not needs or not all(isinstance(p, str) and p for p in needs):
        raise EvalError(f"{where}: needs must be a non-empty list of pool names")
    if len(set(needs)) != len(needs):
        raise EvalError(f"{where}: needs names a pool twice ({needs}); a task takes one slot of each pool")
    task["needs"] = needs
    if not isinstance(task["episodes"], int) or task["episodes"] < 1:
        raise EvalError(f"{where}: episodes must be a positive integer")
    if task["seed"] is not None and (not isinstance(task["seed"], int) or task["seed"] < 0):
        raise EvalError(f"{where}: seed must be a non-negative integer or null")
    if task["options"] is not None and not isinstance(task["options"], dict):
        raise EvalError(f"{where}: options must be a JSON object")
    if not isinstance(task["runner"], str):
        raise EvalError(f"{where}: runner must be the name of a registered task runner")
    if task["runner"] == DEFAULT_RUNNER and len(needs) != 1:
        raise EvalError(f"{where}: task {task['id']} needs {len(needs)} pools ({', '.join(needs)}) but names no "
                        f"runner; the default runner plays episodes on one env: register one that uses them all "
                        f"(sf_core.register_task_runner) and name it in the task's \"runner\"")
    return task


def check_tasks(tasks: list[dict], pools: set[str] | None, runners: set[str], nobody: str = "no pool provides") -> None:
    """Every runner a task names is registered, and every pool it needs exists (None: any name will do,
    envs are built in-process). `nobody` says where the pools come from, for the message."""
    for task in tasks:
        if task["runner"] not in runners:
            raise EvalError(f"task {task['id']} names runner {task['runner']!r}, which is not registered "
                            f"(registered: {', '.join(sorted(runners))}); register it with "
                            f"sf_core.register_task_runner in a module given to --env_module")
    if pools is None:
        return
    missing = sorted({p for t in tasks for p in t["needs"]} - pools)
    if missing:
        first = next(t for t in tasks if set(t["needs"]) & set(missing))
        raise EvalError(f"tasks need {', '.join(missing)}, which {nobody} (task {first['id']} needs "
                        f"{', '.join(first['needs'])}; there are {', '.join(sorted(pools)) or 'none'})")


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
