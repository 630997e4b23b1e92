"""Time from a SIGKILL of a rollout worker to its replacement serving again (--env_fault_policy=restart).

    python scripts/worker_recovery.py --kills=10 --every=3 -- --env=CartPole-v1

Trains with the flags after `--` (CartPole by default) and --env_fault_policy=restart, kills a random rollout
worker's process every --every seconds once frames flow, then lets the run end and prints each kill's recovery
(SIGKILL to the replacement's first frames), their median, and whether any process or /dev/shm segment outlived
the trainer. The functions below are what a fault drill needs: `component_pids` (which process runs which
component, from the running training_summary.json), `kill` and `recoveries` (each kill matched to the fault the
runner recorded, by the dead process's pid).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil


def read_summary(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}


def component_pids(summary: dict, prefix: str = "rollout_worker_") -> dict[str, int]:
    """Component name -> pid of its process, for the components whose name starts with `prefix`."""
    return {name: pid for name, pid in summary.get("pids", {}).items() if name.startswith(prefix) and pid}


def kill(pid: int) -> float:
    """SIGKILL `pid`; returns when (time.time(), the clock training_summary.json's faults use)."""
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    return at


def recoveries(faults: list[dict], kills: list[tuple[int, float]]) -> list[dict]:
    """Each kill (pid, when) with the fault the runner recorded for that pid, and the seconds from the kill to
    the replacement's first frames (None if it never served again)."""
    by_pid = {int(m.group(1)): f for f in faults if (m := re.search(r"\(pid (\d+)\)", f["cause"]))}
    found = []
    for pid, at in kills:
        fault = by_pid.get(pid, {})
        recovered = fault.get("recovered_at")
        found.append({"pid": pid, "component": fault.get("component"), "action": fault.get("action"),
                      "seconds": recovered - at if recovered else None})
    return found


def shm_segments() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def drill(trainer_args: list[str], kills: int, every: float, seed: int,
          log: str | None = None) -> tuple[list[dict], dict, bool]:
    """Train, kill `kills` rollout workers `every` seconds apart; (recoveries, final summary, anything leaked)."""
    rng = random.Random(seed)
    train_dir = tempfile.mkdtemp(prefix="worker_recovery_")
    path = os.path.join(train_dir, "drill", "training_summary.json")
    shm_before = shm_segments()
    cmd = [sys.executable, "-m", "sf_core.train", *trainer_args, f"--train_dir={train_dir}", "--experiment=drill",
           "--env_fault_policy=restart", "--experiment_summaries_interval=0.2", "--train_for_env_steps=10000000000",
           f"--train_for_seconds={kills * every + 60}", f"--max_worker_replacements={kills + 1}"]
    output = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the trainer
    proc = subprocess.Popen(cmd, stdout=output, stderr=subprocess.STDOUT)
    done: list[tuple[int, float]] = []
    try:
        children = []
        while len(done) < kills and proc.poll() is None:
            time.sleep(every if done else 0.5)
            summary = read_summary(path)
            children = psutil.Process(proc.pid).children(recursive=True) or children
            killed = {pid for pid, _ in done}
            workers = {name: pid for name, pid in component_pids(summary).items() if pid not in killed}
            if summary.get("frames", 0) and workers:  # a worker not replaced yet is not listed again until it is
                pid = workers[rng.choice(sorted(workers))]
                with contextlib.suppress(ProcessLookupError):  # it died meanwhile
                    done.append((pid, kill(pid)))
        time.sleep(every)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    _, alive = psutil.wait_procs(children, timeout=10)
    ours = {proc.pid, *(c.pid for c in children), *(pid for pid, _ in done)}
    leaked = bool(alive) or any(s.split("_")[1:2] == [str(pid)] for s in shm_segments() - shm_before for pid in ours)
    summary = read_summary(path)
    return recoveries(summary.get("faults", []), done), summary, leaked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between kills")
    parser.add_argument("--seed", type=int, default=0, help="which worker each kill picks")
    parser.add_argument("--log", default=None, help="a file for the trainer's console")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    trainer_args = [a for a in args.trainer_args if a != "--"] or ["--env=CartPole-v1"]
    found, summary, leaked = drill(trainer_args, args.kills, args.every, args.seed, args.log)
    for k, r in enumerate(found):
        seconds = f"{r['seconds']:.2f}s" if r["seconds"] is not None else "never"
        print(f"kill {k + 1}: pid {r['pid']} ({r['component']}): {r['action']}, serving again after {seconds}")
    times = [r["seconds"] for r in found if r["seconds"] is not None]
    print(f"median recovery: {statistics.median(times):.2f}s over {len(times)} of {len(found)} kills" if times
          else "no recovery measured")
    print(f"run: exit {summary.get('exit_code')}, {summary.get('frames', 0):,} frames, "
          f"{summary.get('worker_replacements', 0)} replacements, {summary.get('worker_restarts', 0)} full restarts; "
          f"{'something leaked' if leaked else 'nothing left behind'}")
    return 0 if times and len(times) == len(found) and not leaked else 1


if __name__ == "__main__":
    sys.exit(main())
