"""A chaos soak: train while killing a random component every few seconds, then check what survived.

    python scripts/chaos_soak.py --minutes=10 --kill_every=20 --runs=3 -- --env=CartPole-v1

Each run starts `python -m sf_core.train` with the flags after `--` (plus --train_dir, a frame budget it cannot
reach and --train_for_seconds=the soak's length) and, every --kill_every seconds, SIGKILLs one component process
chosen at random among --kinds (found by their OS names: sf:rw0, sf:inf0, sf:learner; see
sf_core/contracts/component.py, process_title). With --hang, every other fault is a SIGSTOP instead: a hung
component, which the trainer must find by its heartbeat. Then --baseline_runs runs of the same length without
faults give the frames/s the soak is compared with.

With --ray the trainer samples on Ray (--ray_address=local unless the flags after `--` name a cluster) and the
faults go to its sampler actors (--kinds=sampler by default): a sampler's process, found by its thread named
sf:sampler0, sf:sampler1, ... (sf_core/cluster/sampler.py), is SIGKILLed, and the trainer replaces it
(sf_core/cluster/ingest.py). On a cluster of several machines only the samplers on this one are found.

Per run it reports every fault (what, when, how long until a process of that name served again, and what the
trainer's own fault log says it did: `replaced` alone, `restarted every component`, or `restored every component
from the newest checkpoint`, with its recovery time) and checks:
the run ended with exit code 0; its final mean return reached --target (default: the env's solved threshold
where it has one); the frame counter, read live from training_summary.json, never went backwards; and nothing
was left behind: no process of the trainer's tree, no new /dev/shm entry. The figures go to --output as JSON.
"""

from __future__ import annotations

import argparse
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
from dataclasses import asdict, dataclass, field

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sf_core.cli.arguments import add_bool_argument  # noqa: E402

KINDS = {"rollout_worker": "sf:rw", "inference_worker": "sf:inf", "learner": "sf:learner", "sampler": "sf:sampler"}
SOLVED = {"CartPole-v1": 475.0, "CartPole-v0": 195.0, "Acrobot-v1": -100.0}
POLL_SEC = 0.25


@dataclass
class Fault:
    kind: str  # a key of KINDS
    name: str  # the process's OS name
    pid: int
    how: str  # "SIGKILL" or "SIGSTOP"
    at: float  # seconds after launch
    served_again_after: float | None = None  # seconds until a new process of that name ran and frames grew
    action: str | None = None  # what the trainer did about it, from its own fault log (None: not recorded)
    recovery_seconds: float | None = None  # the trainer's own: from seeing the death to serving or training again


@dataclass
class RunResult:
    faults: bool
    exit_code: int | None
    seconds: float
    frames: int
    fps: float
    mean_return: float | None
    frames_went_backwards: bool
    leftover_processes: list[str] = field(default_factory=list)
    leftover_shm: list[str] = field(default_factory=list)
    summary_faults: list = field(default_factory=list)  # what the trainer itself recorded
    sampler_events: list = field(default_factory=list)  # --ray: samplers lost, waiting for room, started again
    fewest_live_samplers: int | None = None
    injected: list[Fault] = field(default_factory=list)
    log: str = ""  # the trainer's console


def components(root: psutil.Process, samplers_anywhere: bool = False) -> dict[str, psutil.Process]:
    """The trainer's component processes by OS name, and its Ray sampler actors by their sampler thread's
    name: a local cluster's are the trainer's descendants; with `samplers_anywhere` (a cluster started
    elsewhere), any on this machine."""
    found = {}
    descendants = root.children(recursive=True)
    for child in descendants:
        try:
            name = child.name()
        except psutil.Error:
            continue
        if name.startswith("sf:") and child.status() != psutil.STATUS_ZOMBIE:
            found[name] = child
    for proc in psutil.process_iter() if samplers_anywhere else descendants:
        name = sampler_name(proc)
        if name is not None:
            found[name] = proc
    return found


def sampler_name(proc: psutil.Process) -> str | None:
    """sf:samplerN if `proc` is a Ray sampler actor (Ray titles it ray::Sampler...; its thread bears the name)."""
    try:
        if not proc.name().startswith("ray::Sampler") or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        for thread in proc.threads():
            with open(f"/proc/{proc.pid}/task/{thread.id}/comm") as f:
                name = f.read().strip()
            if name.startswith(KINDS["sampler"]):
                return name
    except (psutil.Error, OSError):
        pass
    return None


def read_summary(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):  # not written yet, or caught mid-replace
        return {}


class Soak:
    """One run of the trainer, with or without faults, watched every POLL_SEC."""

    def __init__(self, args: argparse.Namespace, trainer_args: list[str], faults: bool, seed: int):
        self.args, self.faults, self.rng = args, faults, random.Random(seed)
        self.train_dir = tempfile.mkdtemp(prefix="chaos_soak_")
        self.summary_path = os.path.join(self.train_dir, "soak", "training_summary.json")
        self.cmd = [sys.executable, "-m", "sf_core.train", *trainer_args, f"--train_dir={self.train_dir}",
                    "--experiment=soak", "--train_for_env_steps=100000000000",
                    f"--train_for_seconds={args.minutes * 60:g}", "--experiment_summaries_interval=1"]
        self.injected: list[Fault] = []
        self.samplers_anywhere = args.ray and "--ray_address=local" not in trainer_args
        self.stopped: list[psutil.Process] = []  # SIGSTOPped: resumed at the end if the trainer did not kill them
        self.seen_pids: set[int] = set()
        self.last_frames = 0
        self.backwards = False

    def run(self) -> RunResult:
        shm_before = set(os.listdir("/dev/shm"))
        started = time.time()
        # the console to a file, not a pipe: a pipe nobody reads fills within minutes and blocks the trainer
        with open(os.path.join(self.train_dir, "train.log"), "w") as log:
            proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        root = psutil.Process(proc.pid)
        next_fault = started + self.args.first_fault
        deadline = started + self.args.minutes * 60 + self.args.grace
        try:
            while proc.poll() is None and time.time() < deadline:
                time.sleep(POLL_SEC)
                self.watch(root, time.time() - started)
                if self.faults and time.time() >= next_fault:
                    self.inject(root, time.time() - started)
                    next_fault += self.args.kill_every
        finally:
            self.finish(proc)
        return self.result(proc, started, shm_before)

    def watch(self, root: psutil.Process, now: float) -> None:
        found = components(root, self.samplers_anywhere)
        self.seen_pids.update(p.pid for p in found.values())
        frames = read_summary(self.summary_path).get("frames") or 0
        if frames < self.last_frames:
            self.backwards = True
        for fault in self.injected:
            if fault.served_again_after is None and frames > self.last_frames:
                successor = found.get(fault.name)
                if successor is not None and successor.pid != fault.pid:
                    fault.served_again_after = round(now - fault.at, 2)
        self.last_frames = max(self.last_frames, frames)

    def inject(self, root: psutil.Process, now: float) -> None:
        found = components(root, self.samplers_anywhere)
        kind = self.rng.choice(self.args.kinds)
        victims = sorted(name for name in found if name.startswith(KINDS[kind]))
        if not victims:
            return
        name = self.rng.choice(victims)
        victim = found[name]
        hang = self.args.hang and len(self.injected) % 2 == 1
        try:
            victim.send_signal(signal.SIGSTOP if hang else signal.SIGKILL)
        except psutil.Error:
            return
        if hang:
            self.stopped.append(victim)
        self.injected.append(Fault(kind, name, victim.pid, "SIGSTOP" if hang else "SIGKILL", round(now, 2)))
        print(f"  {now:7.1f}s  {self.injected[-1].how} {name} (pid {victim.pid})", flush=True)

    def finish(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for p in self.stopped:  # a hung process the trainer never killed would otherwise stay stopped
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass

    def result(self, proc: subprocess.Popen, started: float, shm_before: set[str]) -> RunResult:
        time.sleep(1.0)  # a component's parent watchdog ends it within a second of the trainer
        leftover = [f"{p.pid} {p.name()}" for p in map(_alive, self.seen_pids) if p is not None]
        shm = leaked_shm(shm_before)
        summary = read_summary(self.summary_path)
        match_actions(self.injected, summary.get("faults", []))
        seconds = summary.get("seconds") or (time.time() - started)
        frames = summary.get("frames") or 0
        cluster = summary.get("cluster") or {}
        return RunResult(self.faults, proc.returncode, round(seconds, 1), frames, round(frames / seconds, 1),
                         summary.get("mean_return"), self.backwards, leftover, shm,
                         summary.get("faults", []), cluster.get("events", []), cluster.get("fewest_live_samplers"),
                         self.injected, os.path.join(self.train_dir, "train.log"))


def match_actions(injected: list[Fault], recorded: list[dict]) -> None:
    """Each fault's action and recovery time, from the trainer's fault log: its cause names the pid it saw die (a
    process killed while every component was already being restored is not in it)."""
    by_pid = {}
    for entry in recorded:
        for pid in re.findall(r"\(pid (\d+)\)", entry.get("cause", ""))[:1]:
            by_pid.setdefault(int(pid), entry)
    for fault in injected:
        entry = by_pid.get(fault.pid)
        if entry is not None:
            fault.action, fault.recovery_seconds = entry.get("action"), entry.get("recovery_seconds")


def by_action(faults: list[Fault]) -> dict[str, list[float | None]]:
    """'kind: action' -> the trainer's recovery times of those faults."""
    found: dict[str, list[float | None]] = {}
    for fault in faults:
        found.setdefault(f"{fault.kind}: {fault.action or 'not in the fault log'}", []).append(fault.recovery_seconds)
    return found


def leaked_shm(before: set[str]) -> list[str]:
    """New /dev/shm entries that stay and that no live process maps: other programs on the machine create
    and remove their own meanwhile (multiprocessing's semaphores live there for a moment)."""
    new = set(os.listdir("/dev/shm")) - before
    if new:
        time.sleep(2.0)
        new &= set(os.listdir("/dev/shm"))
    in_use = set()
    for pid in psutil.pids() if new else []:
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
            in_use.update(name for name in new if f"/dev/shm/{name}" in maps)
        except OSError:
            continue
    return sorted(new - in_use)


def _alive(pid: int) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        return p if p.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def verdict(result: RunResult, target: float | None) -> list[str]:
    """What went wrong in one run (empty: it passed)."""
    problems = []
    if result.exit_code != 0:
        problems.append(f"exit code {result.exit_code}")
    if target is not None and (result.mean_return is None or result.mean_return < target):
        problems.append(f"mean return {result.mean_return} < {target:g}")
    if result.frames_went_backwards:
        problems.append("the frame counter went backwards")
    if result.leftover_processes:
        problems.append(f"processes left: {result.leftover_processes}")
    if result.leftover_shm:
        problems.append(f"/dev/shm entries left: {result.leftover_shm}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of each run")
    parser.add_argument("--kill_every", type=float, default=20.0, help="seconds between faults")
    parser.add_argument("--first_fault", type=float, default=15.0, help="seconds after launch of the first fault")
    parser.add_argument("--kinds", default=None, help=f"which components to kill, of {','.join(KINDS)} (default: "
                        "rollout_worker,inference_worker,learner; with --ray, sampler)")
    add_bool_argument(parser, "ray", False, "sample on Ray (--ray_address=local unless given after --); sampler "
                      "actors can be killed")
    add_bool_argument(parser, "hang", False, "every other fault a SIGSTOP (a hung component)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline_runs", type=int, default=1, help="runs of the same length without faults")
    parser.add_argument("--target", type=float, default=None, help="final mean return each run must reach")
    parser.add_argument("--grace", type=float, default=90.0, help="seconds past --minutes before the run is stopped")
    parser.add_argument("--output", default="chaos_soak.json")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    kinds = args.kinds or ("sampler" if args.ray else "rollout_worker,inference_worker,learner")
    args.kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown:
        parser.error(f"--kinds: unknown {unknown}; choose among {list(KINDS)}")
    if "sampler" in args.kinds and not args.ray:
        parser.error("--kinds=sampler: samplers are Ray actors; add --ray")
    trainer_args = [a for a in args.trainer_args if a != "--"] or ["--env=CartPole-v1"]
    if args.ray and not any(a.startswith("--ray_address=") for a in trainer_args):
        trainer_args.append("--ray_address=local")
    # a soak faults far more often than a real run: the caps that stop a run faulting again and again stay out
    # of its way unless given (docs/faults.md)
    caps = ("max_recoveries", "max_worker_replacements", *(("max_sampler_restarts",) if args.ray else ()))
    trainer_args += [f"--{cap}=1000000" for cap in caps if not any(a.startswith(f"--{cap}=") for a in trainer_args)]
    env = next((a.split("=", 1)[1] for a in trainer_args if a.startswith("--env=")), None)
    target = args.target if args.target is not None else SOLVED.get(env or "")
    results = []
    for k in range(args.runs + args.baseline_runs):
        with_faults = k < args.runs
        print(f"run {k + 1}: {'with faults' if with_faults else 'baseline, no faults'}", flush=True)
        results.append(Soak(args, trainer_args, with_faults, seed=k).run())
        print(report_line(results[-1], target), flush=True)
    return summarize(results, target, args.output)


def report_line(result: RunResult, target: float | None) -> str:
    times = [f.served_again_after for f in result.injected if f.served_again_after is not None]
    problems = verdict(result, target)
    lost = sum(e["event"] == "lost" for e in result.sampler_events)
    started = sum(e["event"] == "started" for e in result.sampler_events)
    ray = (f", samplers lost {lost}, started again {started}, fewest live {result.fewest_live_samplers}"
           if result.sampler_events else "")
    return (f"  {result.frames:,} frames in {result.seconds:.0f} s ({result.fps:,.0f}/s), mean return "
            f"{result.mean_return}, {len(result.injected)} faults{ray}, served again after "
            f"{statistics.median(times) if times else '-'} s (median); "
            + "".join(f"{what} {len(t)}; " for what, t in sorted(by_action(result.injected).items()))
            + ("passed" if not problems else "FAILED: " + "; ".join(problems) + f" (console: {result.log})"))


def summarize(results: list[RunResult], target: float | None, output: str) -> int:
    soaked = [r for r in results if r.faults]
    baseline = [r for r in results if not r.faults]
    ratio = (statistics.median(r.fps for r in soaked) / statistics.median(r.fps for r in baseline)
             if soaked and baseline else None)
    recoveries = sorted(f.served_again_after for r in soaked for f in r.injected
                        if f.served_again_after is not None)
    never = sum(f.served_again_after is None for r in soaked for f in r.injected)
    failed = [k for k, r in enumerate(results) if verdict(r, target)]
    actions = {what: {"faults": len(t),
                      "recovery_seconds_median": round(statistics.median(known), 2) if known else None,
                      "recovery_seconds_max": round(max(known), 2) if known else None}
               for what, t in sorted(by_action([f for r in soaked for f in r.injected]).items())
               for known in [[x for x in t if x is not None]]}
    report = {"runs": [asdict(r) for r in results], "fps_ratio_to_baseline": ratio, "by_action": actions,
              "served_again_after_median": statistics.median(recoveries) if recoveries else None,
              "faults_never_served_again": never, "failed_runs": failed, "target": target}
    with open(output, "w") as f:
        json.dump(report, f, indent=1)
    print(f"frames/s with faults / without: {ratio:.2f}" if ratio else "no baseline run")
    print(f"served again after a fault: median {report['served_again_after_median']} s over "
          f"{len(recoveries)} faults; {never} not seen serving again; failed runs: {failed or 'none'}")
    for what, found in actions.items():
        print(f"{what}: {found['faults']} faults, the trainer's recovery time median "
              f"{found['recovery_seconds_median']} s (max {found['recovery_seconds_max']} s)")
    print(f"results: {output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
