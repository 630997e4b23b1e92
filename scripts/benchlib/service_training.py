"""Training on env services, timed: the slow-simulator phase of scripts/bench_env_service.py.

Each case starts its env servers (from the checkout under test, so a baseline commit gets its own
protocol), trains one rollout worker on them through `python -m sf_core.train`, and takes frames/s from
the trainer's summary file over the timed window (benchlib.ours), then stops everything.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from . import REPO
from .ours import run_ours


@dataclass
class Case:
    name: str
    env: str
    servers: int
    slots: int  # per server
    parallel: bool


CASES = {
    "slow_4_slots": Case("slow_4_slots", "SleepyCartPole-v1", 1, 4, True),
    "slow_8_slots_2_servers": Case("slow_8_slots_2_servers", "SleepyCartPole-v1", 2, 4, True),
    "cartpole_4_slots": Case("cartpole_4_slots", "CartPole-v1", 1, 4, False),
}


def start_servers(case: Case, repo: str, work_dir: str, step_ms: float) -> tuple[list[subprocess.Popen], list[str]]:
    """The case's env servers, from `repo`; their processes and `host:port*slots` entries."""
    scripts = os.path.join(REPO, "scripts")  # benchlib.slow_env, whichever checkout serves it
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, scripts]), SF_BENCH_STEP_MS=str(step_ms))
    procs, entries = [], []
    for n in range(case.servers):
        log_path = os.path.join(work_dir, f"{case.name}_server_{n}.log")
        command = [sys.executable, "-m", "sf_core.env_server", f"--env={case.env}", "--port=0",
                   f"--capacity={case.slots}", f"--parallel={case.parallel}", "--env_module=benchlib.slow_env"]
        with open(log_path, "w") as log:
            procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=repo, env=env,
                                          start_new_session=True))
        entries.append(f"127.0.0.1:{_wait_for_port(procs[-1], log_path)}*{case.slots}")
    return procs, entries


def _wait_for_port(proc: subprocess.Popen, log_path: str, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"tcp://[\d.]+:(\d+)", open(log_path).read())
        if found:
            return int(found.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"env server exited: {open(log_path).read()}")
        time.sleep(0.1)
    raise RuntimeError(f"env server did not start within {timeout:g}s")


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run_case(case: Case, args: argparse.Namespace, repo: str, label: str) -> dict:
    procs, entries = start_servers(case, repo, args.work_dir, args.step_ms)
    try:
        flags = [f"--env={case.env}", f"--env_service={','.join(entries)}", "--num_workers=1"]
        result = run_ours(f"{case.name}_{label}", args, flags, [], args.work_dir, sampling_only=False, repo=repo)
    finally:
        _stop(procs)
    slots = case.servers * case.slots
    fps = result.get("fps")
    return {"case": case.name, "build": label, "slots": slots, "fps": fps,
            "fps_per_slot": round(fps / slots, 1) if fps else None, "status": result["status"],
            "error": result.get("error"), "command": result["command"]}
