"""A folder per evaluation task: `output_dir/<task id>/`.

The task runner gets its task's folder as `task["folder"]` and may write anything there (a trajectory,
screenshots, a video, logs). Each attempt starts with the folder empty, so a retried task never mixes its
files with those of the attempt that failed. When the task ends (ok or failed) the coordinator writes
`result.json` there, the task's result line, atomically and last: it is the marker `--resume` goes by, and a
folder without it is an unfinished task, run again from an empty folder.

Folder names are task ids, except for characters a file name cannot hold (`/`, and a leading `.`), which are
percent-encoded, as is `%` itself: two ids never share a folder.
"""

from __future__ import annotations

import json
import os
import shutil
from urllib.parse import quote

from sf_core.evaluation.tasks import finished_ids

RESULT = "result.json"


def folder_name(task_id: str) -> str:
    name = quote(task_id, safe=" !#$&'()+,;=@[]^`{}~-_")  # `%` and `/` always encoded, unlike these
    return "%2E" + name[1:] if name.startswith(".") else name or "%"


def task_folder(output_dir: str, task_id: str) -> str:
    return os.path.join(os.path.abspath(output_dir), folder_name(task_id))


def start_attempt(folder: str) -> None:
    """An empty folder for an attempt: whatever an earlier attempt left there is removed."""
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)


def write_result(folder: str, line: dict) -> None:
    """The task's result in its folder, written whole or not at all (the marker of a finished task)."""
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, RESULT + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(line, f, indent=1)
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename makes it the marker
    os.replace(tmp, os.path.join(folder, RESULT))


def finished(output_dir: str, task_ids: list[str]) -> dict[str, dict]:
    """The results of the tasks whose folder has the marker, by id."""
    done = {}
    for task_id in task_ids:
        try:
            with open(os.path.join(task_folder(output_dir, task_id), RESULT), encoding="utf-8") as f:
                line = json.load(f)
        except (OSError, ValueError):
            continue  # no marker (or not the evaluator's): the task runs again
        if isinstance(line, dict) and line.get("id") == task_id:
            done[task_id] = line
    return done


def clear(output_dir: str, task_ids: list[str]) -> None:
    """A fresh run (no --resume): the folders of these tasks go, so no marker of an earlier run survives."""
    for task_id in task_ids:
        folder = task_folder(output_dir, task_id)
        if os.path.isdir(folder):
            shutil.rmtree(folder)


def resume(output: str, output_dir: str, task_ids: list[str]) -> set[str]:
    """The ids `--resume` skips: the tasks whose folder has the marker, and those with a line in the results
    file (an evaluation from before task folders). A finished task whose line a kill cut off (the marker is
    written first) gets its line back, so the results file lists every finished task once."""
    done = finished(output_dir, task_ids)
    lines = finished_ids(output)
    missing = [done[task_id] for task_id in task_ids if task_id in done and task_id not in lines]
    if missing:
        with open(output, "a", encoding="utf-8") as out:
            out.writelines(json.dumps(line) + "\n" for line in missing)
    return set(done) | lines
