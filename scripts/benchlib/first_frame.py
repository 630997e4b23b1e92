"""The first_frame phase: how long after its launch the trainer steps its first env frame, beside the floor no
trainer can beat on this machine: a bare interpreter importing torch with the garbage collector off.

Launches alternate (the floor, ours, then the --baseline_repo trainer if given), so the machine's drift falls on
each alike, and each trainer's figure is also taken as its difference from the floor launched just before it.
Every figure counts from the moment the OS started the process (/proc, in 10 ms ticks): the floor prints its
own, the trainer's is `startup.runner.first_frame` in its training_summary.json, which counts from that same
moment (sf_core/contracts/timing.py, process_started_at). Each trainer trains to its first frames and stops
(--train_for_env_steps=1) in an experiment folder of its own, as a first run would. One turn runs first and is
not counted: it loads the files into the OS's cache (and writes bytecode where Python may).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess

from . import REPO
from .checkout import checkout_env

# the floor: seconds from the process's start to torch imported, the collector off as the trainer has it
FLOOR = """import gc
gc.disable()
import torch
import os, time
with open("/proc/self/stat") as f:
    ticks = int(f.read().rsplit(")", 1)[1].split()[19])
print(time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
"""


def spread(values: list[float]) -> dict:
    """Median, lowest and highest, to the millisecond; None figures where there are no values."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def run_floor(python: str, env: dict[str, str], timeout: float) -> float:
    proc = subprocess.run([python, "-c", FLOOR], capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the bare torch import failed: {proc.stderr.strip()[-500:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def run_trainer(command: list[str], repo: str, env: dict[str, str], summary_path: str, timeout: float) -> dict:
    """One launch: the trainer's start-up timeline (seconds after its process started)."""
    proc = subprocess.run(command, capture_output=True, text=True, cwd=repo, env=env, timeout=timeout)
    try:
        with open(summary_path) as f:
            startup = json.load(f).get("startup", {}).get("runner", {})
    except (OSError, ValueError):
        startup = {}
    if proc.returncode != 0 or startup.get("first_frame") is None:
        tail = (proc.stdout + proc.stderr)[-800:]
        raise RuntimeError(f"exit code {proc.returncode}, no first frame in its start-up timeline: {tail}")
    return startup


def trainer_command(python: str, cfg_argv: list[str], extra: list[str], train_dir: str, experiment: str) -> list[str]:
    return [python, "-m", "sf_core.train", *cfg_argv, *extra, "--train_for_env_steps=1",
            f"--train_dir={train_dir}", f"--experiment={experiment}", "--restart_behavior=overwrite"]


def bytecode_note(repo: str, env: dict[str, str]) -> str:
    """Whether the trainer's own modules loaded from cached bytecode or were compiled at every launch (about
    0.15 s more on this 2-core machine: docs/performance.md, "The first frame against a bare torch import")."""
    prefix = env.get("PYTHONPYCACHEPREFIX")
    where = (os.path.join(prefix, os.path.realpath(repo).lstrip(os.sep), "sf_core") if prefix
             else os.path.join(repo, "sf_core", "__pycache__"))
    if os.path.isdir(where) and any(name.endswith(".pyc") for name in os.listdir(where)):
        return f"loaded from cached bytecode ({where})"
    if env.get("PYTHONDONTWRITEBYTECODE"):
        return "compiled at every launch (PYTHONDONTWRITEBYTECODE is set and no bytecode is cached)"
    return "compiled at every launch (no bytecode cached)"


def run_first_frame(args: argparse.Namespace, cfg_argv: list[str], extra: list[str], work_dir: str) -> dict:
    """The phase: args.launches turns of the floor and each trainer; medians and spreads of every figure."""
    repos = {"ours": REPO, **({"baseline": args.baseline_repo} if args.baseline_repo else {})}
    timeout = args.startup_timeout + 60
    floors: list[float] = []
    runs: dict[str, list[dict]] = {name: [] for name in repos}
    commands = {}
    for launch in range(args.launches + 1):  # launch 0: the uncounted turn
        floor = run_floor(args.python, dict(os.environ), timeout)
        for name, repo in repos.items():
            train_dir, experiment = os.path.join(work_dir, f"first_frame_{name}"), f"launch_{launch}"
            command = trainer_command(args.python, cfg_argv, extra, train_dir, experiment)
            commands[name] = shlex.join(command)
            startup = run_trainer(command, repo, checkout_env(repo, work_dir), os.path.join(
                train_dir, experiment, "training_summary.json"), timeout)
            if launch:
                runs[name].append({"startup": startup, "floor": floor,
                                   "over_floor": round(startup["first_frame"] - floor, 3)})
        if launch:
            floors.append(floor)
    result = {"status": "ok", "fps": None, "launches": args.launches, "floor_s": spread(floors),
              "floor_command": shlex.join([args.python, "-c", FLOOR]), "command": commands["ours"],
              "bytecode": bytecode_note(REPO, dict(os.environ))}
    for name, got in runs.items():
        prefix = "" if name == "ours" else f"{name}_"
        result[f"{prefix}first_frame_s"] = spread([r["startup"]["first_frame"] for r in got])
        result[f"{prefix}over_floor_s"] = spread([r["over_floor"] for r in got])
        result[f"{prefix}runs"] = got
        if name != "ours":
            result[f"{prefix}command"] = commands[name]
    result["line"] = summary_line(result)
    return result


def summary_line(result: dict) -> str:
    """`1st frame 1.79 s after launch (1.70-1.90), 0.73 s over a bare torch import (1.06 s)`, per trainer."""
    def figure(s: dict) -> str:
        return f"{s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f})"

    parts = [f"1st frame {figure(result['first_frame_s'])} after launch, {figure(result['over_floor_s'])} over "
             f"a bare torch import ({figure(result['floor_s'])})"]
    if "baseline_first_frame_s" in result:
        parts.append(f"baseline {figure(result['baseline_first_frame_s'])}, "
                     f"{figure(result['baseline_over_floor_s'])} over")
    return "; ".join(parts)
