#!/usr/bin/env python
"""Throughput benchmark: sf_core against raw env stepping (and, optionally, Sample Factory 2.1.1).

Phases, one after another on the same machine:

  raw_env_1proc     one process stepping one env with random actions: the per-core baseline
  raw_env_per_core  one such process per usable core, all at once: the machine's ceiling
  sampling          `python -m sf_core.train ... --sampling_only=True` (rollout + inference + batcher, no SGD)
  training          `python -m sf_core.train ...` (full APPO): env frames/s, samples trained/s, time to 1st frame
  sample_factory    Sample Factory 2.1.1 with the same configuration, if --sf_python points at a Python
                    that has it installed (a separate venv); otherwise reported as 'not run'

Frames per second exclude a warm-up. For the trainers they come from the status lines printed while
they run (ours every second, `--report_interval=1`; Sample Factory's every 5 s), not from the final
summary: the timed window opens at the first status line at least --warmup seconds after the first one
that shows frames (start-up is reported separately, as time to first frame) and closes at the first
status line --seconds later; FPS = (frames at close - frames at open) / (time between them). Then the
trainer is stopped the way Ctrl-C stops it (SIGINT: it finishes cleanly and writes
training_summary.json); --train_for_seconds is only a safety bound. Raw env phases count env steps in
[min(warmup, 1 s), that + --seconds] in every process.

Peak memory is the largest sum of RSS (and of PSS, which counts shared pages once) over the phase's
processes and all their descendants, sampled every 0.5 s.

Example:
    python scripts/benchmark.py --env=CartPole-v1 --num_workers=2 --seconds=30 --warmup=5 \\
        --sf_python=/path/to/sf_venv/bin/python --output=benchmark_results.json
Flags for our trainer only: --extra="--with_vtrace=True --num_epochs=2" (repeatable); for SF: --sf_extra.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import multiprocessing
import os
import platform
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Callable

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

MB = 1024 * 1024
MEMORY_SAMPLE_SEC = 0.5
REPORT_INTERVAL_SEC = 1.0  # our trainer's status lines while benchmarking
SF_REPORT_INTERVAL_SEC = 5.0  # Sample Factory 2 prints its "Fps is ..." line every 5 s (not configurable)
STOP_GRACE_SEC = 30.0  # after SIGINT, how long a trainer may take to shut down before it is killed
WINDOW_TOLERANCE_SEC = 0.05  # a status line this early still ends the timed window
ALL_PHASES = ("raw", "sampling", "training", "sf")

# "12:00:01 INFO [  12.3s] frames 123,456 | fps 9,876 | return ... | policy v3 lag 0.4 | trained 120,000"
OUR_STATUS = re.compile(r"\[\s*(?P<elapsed>[0-9.]+)s\] frames (?P<frames>[0-9,]+) \| fps .*?"
                        r"\| trained (?P<trained>[0-9,]+)")
# "[2023-06-19 08:22:20,123][01234] Fps is (10 sec: 4096.0, ...). Total num frames: 40960. Throughput: 0: 4000.0.
#  Samples: 40960. Policy #0 lag: (...)"
SF_STATUS = re.compile(r"Fps is \(.*?\)\. Total num frames: (?P<frames>\d+)\.(?:.*?Samples: (?P<samples>\d+))?")
SF_TIMESTAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")
SF_FINAL = re.compile(r"Collected \{(?P<steps>[^}]*)\}, FPS: (?P<fps>[0-9.]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Interrupted(Exception):
    """SIGTERM received by the benchmark (Ctrl-C is KeyboardInterrupt): stop and write what we have."""


# --------------------------------------------------------------------------------------------------
# Process trees: memory sampling and clean-up


class TreeMonitor(threading.Thread):
    """Samples RSS/PSS summed over some root processes and all their descendants; remembers every
    process it has seen, so the whole tree can be killed even after a parent died."""

    def __init__(self, roots: list[int], interval: float = MEMORY_SAMPLE_SEC):
        super().__init__(name="tree_monitor", daemon=True)
        self.interval = interval
        self.seen: dict[int, psutil.Process] = {}
        self.cmdlines: dict[int, str] = {}
        for pid in roots:
            self._remember(pid)
        self.roots = list(roots)
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_processes = 0
        self.samples = 0
        self.pss_available = True
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def _remember(self, pid: int) -> psutil.Process | None:
        proc = self.seen.get(pid)
        if proc is None:
            try:
                proc = psutil.Process(pid)
            except psutil.Error:
                return None
            self._add(proc)
        return proc

    def _add(self, proc: psutil.Process) -> psutil.Process:
        if proc.pid not in self.seen:
            self.seen[proc.pid] = proc
            self.cmdlines[proc.pid] = _cmdline(proc)  # kept: a dying process can no longer tell
        return self.seen[proc.pid]

    def processes(self) -> list[psutil.Process]:
        """The roots and their live descendants right now (and remember them)."""
        found: dict[int, psutil.Process] = {}
        with self._lock:
            for pid in self.roots:
                root = self._remember(pid)
                if root is None or not root.is_running():
                    continue
                found[root.pid] = root
                try:
                    for child in root.children(recursive=True):
                        found[child.pid] = self._add(child)
                except psutil.Error:
                    pass
        return list(found.values())

    def sample(self) -> None:
        rss = pss = 0
        procs = self.processes()
        for proc in procs:
            try:
                if self.pss_available:
                    try:
                        info = proc.memory_full_info()
                        rss += info.rss
                        pss += getattr(info, "pss", info.rss)
                        continue
                    except psutil.AccessDenied:
                        self.pss_available = False
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
        self.samples += 1
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_processes = max(self.peak_processes, len(procs))

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)

    def report(self) -> dict:
        return {"peak_rss_mb": round(self.peak_rss / MB, 1) if self.samples else None,
                "peak_pss_mb": round(self.peak_pss / MB, 1) if self.samples and self.pss_available else None,
                "peak_processes": self.peak_processes, "memory_samples": self.samples}

    def kill_all(self, grace: float) -> list[str]:
        """SIGKILL every process of the tree still alive `grace` seconds from now (they were asked to
        stop before); returns a description of each one killed.

        multiprocessing's resource tracker goes last: once the others are gone it unlinks the
        semaphores and shared memory they leaked, and exits by itself."""
        self.processes()  # pick up children forked since the last sample
        with self._lock:
            alive = [p for p in self.seen.values() if _running(p)]
        _, alive = psutil.wait_procs(alive, timeout=grace)  # exiting on their own: let them
        trackers = [p for p in alive if "resource_tracker" in self.cmdlines.get(p.pid, "")]
        others = [p for p in alive if p not in trackers]
        killed = [p for p in others if _kill(p)]
        psutil.wait_procs(others, timeout=5)
        _, trackers_left = psutil.wait_procs(trackers, timeout=5)
        killed += [p for p in trackers_left if _kill(p)]
        psutil.wait_procs(trackers_left, timeout=2)
        return [f"{p.pid} {self.cmdlines.get(p.pid, '?')}" for p in killed]


def _kill(proc: psutil.Process) -> bool:
    """SIGKILL a live, non-zombie process; whether it was one."""
    if not _running(proc):
        return False
    try:
        proc.kill()
        return True
    except psutil.Error:
        return False


def _cmdline(proc: psutil.Process) -> str:
    try:
        return shlex.join(proc.cmdline())[:200]
    except psutil.Error:
        return "?"


def _kill_session(sid: int, since: float) -> list[str]:
    """SIGKILL the processes of session `sid` (the one a subprocess was started in, with
    start_new_session=True) created since `since`: only what the benchmark started."""
    found, described = [], []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and os.getsid(proc.pid) == sid and proc.create_time() >= since - 1.0:
                if _is_resource_tracker(proc):
                    try:
                        proc.wait(timeout=3)  # it cleans up after the others and exits by itself
                        continue
                    except psutil.TimeoutExpired:
                        pass
                description = f"{proc.pid} {_cmdline(proc)}"
                if _kill(proc):
                    described.append(description)
                    found.append(proc)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    psutil.wait_procs(found, timeout=5)
    return described


def _is_resource_tracker(proc: psutil.Process) -> bool:
    try:
        return any("resource_tracker" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# --------------------------------------------------------------------------------------------------
# Phase (a): raw env stepping


def _raw_env_worker(env_name: str, index: int, warmup: float, seconds: float, ready, go, results) -> None:
    """Step one env with (pre-drawn) random actions; count steps inside [warmup, warmup + seconds]."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    try:
        from envs.registry import EnvContext, registry_snapshot

        env = registry_snapshot().make(env_name, None, EnvContext(worker_index=index, env_index=index, seed=index))
        env.action_space.seed(index)
        actions = [env.action_space.sample() for _ in range(4096)]  # drawn up front: time the env, not sampling
        env.reset(seed=index)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        ready.put((index, f"{type(exc).__name__}: {exc}"))
        return
    ready.put((index, None))
    go.wait()

    chunk, n_actions = 32, len(actions)
    started = time.perf_counter()
    warm_end, end = started + warmup, started + warmup + seconds
    steps = counted = 0
    window_start = None
    now = started
    while now < end:
        for _ in range(chunk):
            _, _, terminated, truncated, _ = env.step(actions[steps % n_actions])
            steps += 1
            if terminated or truncated:
                env.reset()
        now = time.perf_counter()
        if window_start is None:
            if now >= warm_end:
                window_start = now
        else:
            counted += chunk
    window = (now - window_start) if window_start is not None else 0.0
    env.close()
    results.put((index, counted, window, steps))


def run_raw_env(env_name: str, processes: int, warmup: float, seconds: float, frames_per_step: int = 1) -> dict:
    """Env frames/s of `processes` processes stepping at once; a step is `frames_per_step` frames
    (--env_frameskip, e.g. 4 for Atari), the unit the trainer counts in."""
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_raw_env_worker, args=(env_name, i, warmup, seconds, ready, go, results),
                         name=f"raw_env_{i}", daemon=True) for i in range(processes)]
    monitor: TreeMonitor | None = None
    started = time.time()
    try:
        for p in procs:
            p.start()
        monitor = TreeMonitor([p.pid for p in procs])
        monitor.start()
        for _ in procs:
            index, error = ready.get(timeout=120)
            if error:
                raise RuntimeError(f"raw env worker {index} could not make {env_name!r}: {error}")
        go.set()
        got = [results.get(timeout=warmup + seconds + 60) for _ in procs]
        for p in procs:
            p.join(timeout=10)
    finally:
        with _no_interrupts():
            if monitor is not None:
                monitor.stop()
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
            for q in (ready, results):
                q.cancel_join_thread()
                q.close()
    per_process = [frames_per_step * counted / window if window > 0 else 0.0 for _, counted, window, _ in sorted(got)]
    return {
        "status": "ok", "processes": processes, "fps": sum(per_process),
        "fps_per_process": [round(f, 1) for f in per_process],
        "steps_counted": sum(g[1] for g in got), "window_seconds": [round(g[2], 3) for g in got],
        "warmup_seconds": warmup, "wall_seconds": round(time.time() - started, 2),
        "actions": "uniform random, 4096 drawn up front per process and cycled",
        **(monitor.report() if monitor else {}),
    }


# --------------------------------------------------------------------------------------------------
# Running a trainer subprocess and watching its status lines


@dataclass
class Point:
    t: float  # seconds since launch of the subprocess (on the trainer's own clock where it prints one)
    frames: int
    trained: int
    samples: int | None = None  # Sample Factory: samples collected (its "Samples:")


@dataclass
class Watch:
    """What one trainer subprocess printed and how it ended."""

    command: list[str]
    points: list[Point] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    exit_code: int | None = None
    stopped_by: str = ""
    first_frames_t: float | None = None
    window_covered: bool = False
    wall_launched: float = 0.0  # time.time() at launch
    launch_offset: float | None = None  # launch -> the trainer's clock zero (estimated)
    extra: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    wall_seconds: float = 0.0
    killed: list[str] = field(default_factory=list)
    shm_removed: list[str] = field(default_factory=list)  # shared-memory files its processes left behind


def _reader(stream, out: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        out.put((time.monotonic(), line.rstrip("\n")))
    out.put((time.monotonic(), None))


def watch_process(command: list[str], parse: Callable[[str, float, Watch], Point | None], warmup: float,
                  seconds: float, startup_timeout: float, log_path: str, cwd: str | None = None,
                  env: dict | None = None, echo: bool = False) -> Watch:
    """Run `command`, parse its output into points, stop it (SIGINT) once the timed window is covered.

    The window starts `warmup` seconds after the first point with frames > 0 and lasts `seconds`.
    Whatever happens (error, timeout, Ctrl-C of the benchmark), the process and all its descendants
    are gone when this returns or raises.
    """
    w = Watch(command=command, wall_launched=time.time())
    launched = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            errors="replace", cwd=cwd, env=env, start_new_session=True)
    monitor = TreeMonitor([proc.pid])
    monitor.start()
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True)
    reader.start()
    sigint_at: float | None = None
    exited_at: float | None = None
    window_start: float | None = None  # the first status line at or after the end of the warm-up
    eof = False
    try:
        with open(log_path, "w") as log:
            log.write("$ " + shlex.join(command) + "\n")
            while True:
                try:
                    read_at, line = lines.get(timeout=0.25)
                except queue.Empty:
                    read_at, line = time.monotonic(), ""
                now = time.monotonic() - launched
                if line is None:
                    eof = True
                elif line:
                    log.write(line + "\n")
                    w.lines.append(line)
                    if echo:
                        print("    | " + line, flush=True)
                    point = parse(line, read_at - launched, w)
                    if point is not None:
                        w.points.append(point)
                        if w.first_frames_t is None and point.frames > 0:
                            w.first_frames_t = point.t
                        if (window_start is None and w.first_frames_t is not None
                                and point.t >= w.first_frames_t + warmup):
                            window_start = point.t
                        if (window_start is not None and sigint_at is None
                                and point.t >= window_start + seconds - WINDOW_TOLERANCE_SEC):
                            w.window_covered = True
                            w.stopped_by = "benchmark: SIGINT after the timed window"
                            sigint_at = now
                            _signal(proc, signal.SIGINT)
                if eof:  # output closed: the process is exiting
                    try:
                        proc.wait(timeout=STOP_GRACE_SEC)
                    except subprocess.TimeoutExpired:
                        w.stopped_by += "; output closed but the process did not exit: killed"
                    break
                if proc.poll() is not None:  # exited, but a descendant may still hold its output open
                    exited_at = now if exited_at is None else exited_at
                    if now - exited_at > 5.0:
                        w.stopped_by += "; exited but its output stayed open (a child process outlived it)"
                        break
                if sigint_at is None:
                    limit = (startup_timeout if w.first_frames_t is None
                             else w.first_frames_t + warmup + seconds + 3 * SF_REPORT_INTERVAL_SEC + 30)
                    if now > limit:
                        w.stopped_by = (f"benchmark: SIGINT, no frames after {startup_timeout:.0f}s"
                                        if w.first_frames_t is None else "benchmark: SIGINT, status lines stopped")
                        sigint_at = now
                        _signal(proc, signal.SIGINT)
                elif now - sigint_at > STOP_GRACE_SEC:
                    w.stopped_by += f"; killed, still running {STOP_GRACE_SEC:.0f}s after SIGINT"
                    break
    finally:
        try:
            if proc.poll() is None:  # benchmark interrupted or the run hung: ask it to stop (its Ctrl-C path)
                _signal(proc, signal.SIGINT)
                proc.wait(timeout=10)  # a second Ctrl-C skips this wait
        except (subprocess.TimeoutExpired, KeyboardInterrupt, Interrupted):
            pass
        finally:
            with _no_interrupts():
                monitor.stop()
                # the trainer and every component process it may have left (after a clean exit of the
                # trainer, anything still there a few seconds later was left behind)
                w.killed = monitor.kill_all(grace=3.0 if proc.poll() is not None else 0.5)
                w.killed += _kill_session(proc.pid, w.wall_launched)  # and any orphan the monitor did not see
                w.shm_removed = _remove_left_shm(list(monitor.seen))
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                reader.join(timeout=2)
                if proc.stdout:
                    proc.stdout.close()
            w.exit_code = proc.returncode
            w.memory = monitor.report()
            w.wall_seconds = round(time.monotonic() - launched, 2)
    if not w.stopped_by:
        w.stopped_by = "exited by itself"
    return w


def _remove_left_shm(pids: list[int]) -> list[str]:
    """torch's file_system sharing strategy (Sample Factory uses it) names its shared-memory files
    /dev/shm/torch_<creator pid>_*; processes stopped mid-run leave some behind. Once the whole
    tree is gone nobody can use them: remove them so benchmark runs do not fill /dev/shm."""
    removed = []
    for pid in pids:
        for path in glob.glob(f"/dev/shm/torch_{pid}_*"):
            try:
                os.unlink(path)
                removed.append(os.path.basename(path))
            except OSError:
                pass
    return removed


class _no_interrupts:
    """Defer Ctrl-C/SIGTERM while processes are being killed (a second Ctrl-C must not leave orphans)."""

    def __enter__(self):
        self.saved = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self._defer)
        self.pending: int | None = None
        return self

    def _defer(self, signum, _frame):
        self.pending = signum

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        if self.pending is not None and exc[0] is None:
            if self.pending == signal.SIGINT:
                raise KeyboardInterrupt
            raise Interrupted(signal.Signals(self.pending).name)
        return False


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


def window_rates(points: list[Point], first_t: float | None, warmup: float, seconds: float) -> dict:
    """Frames/s and trained/s from the first point at or after first_t + warmup (the window's start) to
    the first point `seconds` later (the one the run was stopped on), or to the last point of all if the
    run ended early."""
    if first_t is None:
        return {"error": "no status line with frames > 0"}
    inside = [p for p in points if p.t >= first_t + warmup - 1e-9]
    if len(inside) < 2:
        return {"error": f"fewer than 2 status lines after the warm-up ({len(inside)})"}
    first = inside[0]
    end_t = first.t + seconds - WINDOW_TOLERANCE_SEC
    last = next((p for p in inside[1:] if p.t >= end_t), inside[-1])
    dt = last.t - first.t
    if dt <= 0:
        return {"error": "empty window"}
    used = [p for p in inside if first.t <= p.t <= last.t]
    rates = [(b.frames - a.frames) / (b.t - a.t) for a, b in zip(used, used[1:]) if b.t > a.t]
    return {
        "fps": (last.frames - first.frames) / dt,
        "trained_per_s": (last.trained - first.trained) / dt,
        "window": {"start_s": round(first.t, 3), "end_s": round(last.t, 3), "seconds": round(dt, 3),
                   "frames": last.frames - first.frames, "trained": last.trained - first.trained,
                   "status_lines": len(used), "complete": last.t >= end_t},
        "interval_fps": {"min": round(min(rates), 1), "max": round(max(rates), 1),
                         "cv": round(_cv(rates), 3)} if rates else None,
    }


def _cv(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean if mean else float("nan")


# --------------------------------------------------------------------------------------------------
# Phases (b) and (c): our trainer


def parse_ours(line: str, read_t: float, w: Watch) -> Point | None:
    m = OUR_STATUS.search(line)
    if not m:
        return None
    elapsed = float(m["elapsed"])
    offset = read_t - elapsed  # launch -> the trainer's clock zero, plus output delay (so: an upper bound)
    w.launch_offset = offset if w.launch_offset is None else min(w.launch_offset, offset)
    # Times on the trainer's own clock: exact intervals, whatever the pipe delays
    return Point(t=elapsed, frames=int(m["frames"].replace(",", "")), trained=int(m["trained"].replace(",", "")))


def our_command(python: str, cfg_argv: list[str], extra: list[str], train_dir: str, experiment: str,
                sampling_only: bool, bound_seconds: float) -> list[str]:
    return [python, "-m", "sf_core.train", *cfg_argv,
            f"--train_for_seconds={bound_seconds:.0f}", "--train_for_env_steps=1000000000000",
            *extra,
            f"--sampling_only={sampling_only}", f"--report_interval={REPORT_INTERVAL_SEC:g}",
            f"--train_dir={train_dir}", f"--experiment={experiment}", "--restart_behavior=overwrite"]


def run_ours(name: str, args, cfg_argv: list[str], extra: list[str], work_dir: str, sampling_only: bool) -> dict:
    bound = args.startup_timeout + args.warmup + args.seconds + 60  # safety only: we stop it ourselves
    command = our_command(args.python, cfg_argv, extra, os.path.join(work_dir, "train_dir"), f"bench_{name}",
                          sampling_only, bound)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=REPO + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    w = watch_process(command, parse_ours, args.warmup, args.seconds, args.startup_timeout,
                      os.path.join(work_dir, f"{name}.log"), cwd=REPO, env=env, echo=args.verbose)
    summary = _read_json(os.path.join(work_dir, "train_dir", f"bench_{name}", "training_summary.json"))
    rates = window_rates(w.points, w.first_frames_t, args.warmup, args.seconds)
    ttff = summary.get("time_to_first_frame") if summary else None
    expected_codes = (0, 130) if w.window_covered else (0,)
    ok = ("fps" in rates and w.exit_code in expected_codes and summary is not None
          and summary.get("error") is None)
    result = {
        "status": "ok" if ok else "failed",
        "fps": rates.get("fps"),
        "samples_trained_per_s": rates.get("trained_per_s"),
        "window": rates.get("window"), "interval_fps": rates.get("interval_fps"),
        "time_to_first_frame_s": (round(w.launch_offset + ttff, 3)
                                  if ttff is not None and w.launch_offset is not None else None),
        "time_to_first_frame_trainer_s": ttff,
        "launch_to_trainer_clock_s": round(w.launch_offset, 3) if w.launch_offset is not None else None,
        "first_status_with_frames_s": w.first_frames_t,
        "exit_code": w.exit_code, "stopped_by": w.stopped_by, "wall_seconds": w.wall_seconds,
        "warmup_seconds": args.warmup, "timed_seconds": args.seconds,
        **w.memory,
        "shm_files_left_behind": len(w.shm_removed),
        "summary": summary,
        "command": shlex.join(command),
    }
    if w.killed:
        result["killed_after_stop"] = w.killed
    if not ok:
        result["error"] = (rates.get("error") or (summary or {}).get("error")
                           or (f"exit code {w.exit_code}" if w.exit_code not in expected_codes
                               else "no training_summary.json"))
        result["output_tail"] = w.lines[-40:]
    return result


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------------
# Phase (d): Sample Factory 2.1.1 (separate interpreter)

# Sample Factory's own sf_examples/train_gym_env.py registers only CartPole-v1; this launcher does the same
# for whatever --env is, with the gym flavour (gymnasium or gym) that the installed Sample Factory uses.
# It is written to a file (not `python -c`) so that SF's spawned worker processes can import make_env.
SF_LAUNCHER = '''\
"""Written by sf_core's scripts/benchmark.py: Sample Factory 2 on any gym(nasium) env id."""
import sys


def _gym():
    try:
        from importlib.metadata import requires
        wants_gymnasium = any(r.startswith("gymnasium") for r in (requires("sample-factory") or []))
    except Exception:
        wants_gymnasium = False
    if wants_gymnasium:
        import gymnasium as gym
    else:
        try:
            import gym
        except ImportError:
            import gymnasium as gym
    return gym


def make_env(full_env_name, cfg=None, env_config=None, render_mode=None):
    return _gym().make(full_env_name, render_mode=render_mode)


def main():
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import run_rl

    env_name = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--env=")][-1]
    register_env(env_name, make_env)
    parser, cfg = parse_sf_args(argv=None, evaluation=False)
    cfg = parse_full_cfg(parser)
    return run_rl(cfg)


if __name__ == "__main__":
    sys.exit(main())
'''


def sf_command(sf_python: str, launcher: str, cfg, sf_extra: list[str], train_dir: str, bound_seconds: float,
               module: str | None = None, env: str | None = None) -> list[str]:
    """The Sample Factory 2 command line equivalent to our resolved config `cfg`."""
    def b(x: bool) -> str:
        return "True" if x else "False"

    entry = ["-m", module] if module else [launcher]
    device = "cpu" if cfg.device == "cpu" else "gpu"
    cmd = [sf_python, *entry, f"--env={env or cfg.env}", "--algo=APPO", f"--train_dir={train_dir}",
           "--experiment=bench_sf", "--restart_behavior=overwrite", f"--device={device}",
           f"--num_workers={cfg.num_workers}", f"--num_envs_per_worker={cfg.num_envs_per_worker}",
           f"--worker_num_splits={cfg.worker_num_splits}",
           f"--policy_workers_per_policy={cfg.policy_workers_per_policy}",
           f"--rollout={cfg.rollout}", f"--batch_size={cfg.batch_size}",
           f"--num_batches_per_epoch={cfg.num_batches_per_epoch}", f"--num_epochs={cfg.num_epochs}",
           "--encoder_mlp_layers", *[str(n) for n in cfg.encoder_mlp_layers],
           "--use_rnn=False", f"--nonlinearity={cfg.nonlinearity}",
           f"--actor_critic_share_weights={b(cfg.actor_critic_share_weights)}",
           f"--normalize_input={b(cfg.normalize_input)}", f"--normalize_returns={b(cfg.normalize_returns)}",
           f"--async_rl={b(cfg.async_rl)}", f"--serial_mode={b(cfg.serial_mode)}",
           f"--with_vtrace={b(cfg.with_vtrace)}", f"--shuffle_minibatches={b(cfg.shuffle_minibatches)}",
           f"--learning_rate={cfg.learning_rate:g}", f"--gamma={cfg.gamma:g}", f"--gae_lambda={cfg.gae_lambda:g}",
           f"--ppo_clip_ratio={cfg.ppo_clip_ratio:g}", f"--ppo_clip_value={cfg.ppo_clip_value:g}",
           f"--value_loss_coeff={cfg.value_loss_coeff:g}", f"--exploration_loss_coeff={cfg.exploration_loss_coeff:g}",
           f"--max_grad_norm={cfg.max_grad_norm:g}", f"--max_policy_lag={cfg.max_policy_lag}",
           f"--reward_scale={cfg.reward_scale:g}", f"--reward_clip={cfg.reward_clip:g}",
           f"--env_frameskip={cfg.env_frameskip}",
           f"--experiment_summaries_interval={max(1, round(cfg.experiment_summaries_interval))}",
           f"--train_for_seconds={int(bound_seconds)}"]
    if cfg.seed >= 0:
        cmd.append(f"--seed={cfg.seed}")
    return cmd + list(sf_extra)


def parse_sf(line: str, read_t: float, w: Watch) -> Point | None:
    line = ANSI.sub("", line)
    m = SF_STATUS.search(line)
    if not m:
        return None
    t = read_t
    ts = SF_TIMESTAMP.search(line)
    if ts:  # SF's own log timestamp (ms): exact intervals, whatever the pipe delays
        stamp = time.mktime(time.strptime(ts.group(1), "%Y-%m-%d %H:%M:%S")) + int(ts.group(2)) / 1000
        if abs(stamp - w.wall_launched - read_t) < 5.0:  # same clock and time zone as ours
            t = stamp - w.wall_launched
    frames = int(m["frames"])
    # frames: SF's own FPS metric (env frames counted by its learner), which is also what it has trained on
    return Point(t=t, frames=frames, trained=frames, samples=int(m["samples"]) if m["samples"] else None)


def run_sf(args, cfg, work_dir: str) -> dict:
    if not args.sf_python:
        return {"status": "not run", "reason": "--sf_python not given"}
    sf_python = shutil.which(args.sf_python) or args.sf_python
    probe = [sf_python, "-c", "import importlib.metadata as m, sample_factory; print(m.version('sample-factory'))"]
    try:
        version = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"status": "failed", "error": f"cannot run {sf_python}: {exc}", "command": shlex.join(probe)}
    if version.returncode != 0:
        return {"status": "failed", "error": f"sample_factory not importable with {sf_python}",
                "output_tail": version.stderr.splitlines()[-10:], "command": shlex.join(probe)}
    sf_version = version.stdout.strip()
    if not sf_version.startswith("2.1"):
        print(f"  warning: {sf_python} has Sample Factory {sf_version}, not 2.1.x", flush=True)

    launcher = os.path.join(work_dir, "sf_gym_launcher.py")
    with open(launcher, "w") as f:
        f.write(SF_LAUNCHER)
    bound = args.startup_timeout + args.warmup + args.seconds + 60
    command = sf_command(sf_python, launcher, cfg, args.sf_extra_flags, os.path.join(work_dir, "sf_train_dir"),
                         bound, args.sf_module, args.sf_env)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)  # keep our repo's packages out of the other venv

    def parse(line: str, read_t: float, w: Watch) -> Point | None:
        final = SF_FINAL.search(ANSI.sub("", line))
        if final:
            w.extra["sf_final_fps"] = float(final["fps"])
        point = parse_sf(line, read_t, w)
        if point is not None:  # SF counts env frames including frameskip (summaries_use_frameskip); samples are steps
            point.trained = point.frames // max(1, cfg.env_frameskip)
        return point

    w = watch_process(command, parse, args.warmup, args.seconds, args.startup_timeout,
                      os.path.join(work_dir, "sample_factory.log"), cwd=work_dir, env=env, echo=args.verbose)
    rates = window_rates(w.points, w.first_frames_t, args.warmup, args.seconds)
    sampled = None
    if "window" in rates:
        win = rates["window"]
        pts = [p for p in w.points if win["start_s"] - 1e-6 <= p.t <= win["end_s"] + 1e-6]
        if len(pts) >= 2 and pts[-1].t > pts[0].t and pts[0].samples is not None and pts[-1].samples is not None:
            sampled = (pts[-1].samples - pts[0].samples) / (pts[-1].t - pts[0].t)
    # stopped by our SIGINT, SF may exit 0, or with its interrupted status, or die of the signal
    expected_codes = (0, 2, 130, -signal.SIGINT) if w.window_covered else (0,)
    ok = "fps" in rates and w.exit_code in expected_codes
    result = {
        "status": "ok" if ok else "failed",
        "version": sf_version,
        "fps": rates.get("fps"),
        "samples_trained_per_s": rates.get("trained_per_s"),
        "samples_collected_per_s": sampled,
        "fps_metric": "SF's 'Total num frames' (env frames counted by its learner), every 5 s",
        "window": rates.get("window"), "interval_fps": rates.get("interval_fps"),
        "sf_reported_final_fps": w.extra.get("sf_final_fps"),
        "first_status_with_frames_s": round(w.first_frames_t, 2) if w.first_frames_t is not None else None,
        "exit_code": w.exit_code, "stopped_by": w.stopped_by, "wall_seconds": w.wall_seconds,
        "warmup_seconds": args.warmup, "timed_seconds": args.seconds,
        **w.memory,
        "shm_files_left_behind": len(w.shm_removed),  # removed by the benchmark afterwards
        "command": shlex.join(command),
    }
    if not ok:
        result["error"] = rates.get("error") or f"exit code {w.exit_code}"
        result["output_tail"] = w.lines[-40:]
    return result


# --------------------------------------------------------------------------------------------------
# Command line, table, JSON


def build_parser() -> argparse.ArgumentParser:
    from sf_core.config import add_bool_argument

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1", help="gymnasium id (or name registered with sf_core)")
    p.add_argument("--num_workers", type=int, help="rollout workers (default: the trainer's)")
    p.add_argument("--num_envs_per_worker", type=int, help="envs per worker (default: the trainer's/preset's)")
    p.add_argument("--worker_num_splits", type=int, help="splits per worker (default: the trainer's)")
    p.add_argument("--rollout", type=int, help="rollout length (default: the trainer's/preset's)")
    p.add_argument("--batch_size", type=int, help="SGD minibatch size (default: the trainer's/preset's)")
    p.add_argument("--encoder_mlp_layers", type=int, nargs="+", help="MLP encoder sizes, e.g. 512 512")
    p.add_argument("--seconds", type=float, default=30.0, help="duration of each timed phase (after warm-up)")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds excluded from FPS, counted from the first frame (raw env phases: min(warmup, 1))")
    p.add_argument("--output", default="benchmark_results.json", help="JSON results path")
    p.add_argument("--sf_python", help="python of a separate venv with sample-factory 2.1.1; absent: SF not run")
    p.add_argument("--sf_env", help="the env's id for Sample Factory where its gymnasium 0.29 names it differently "
                                    "(HalfCheetah-v4 for our HalfCheetah-v5: same model, dynamics and spaces)")
    p.add_argument("--sf_module", help="run SF as `python -m MODULE` (e.g. sf_examples.train_gym_env, which "
                                       "registers only CartPole-v1) instead of the built-in launcher")
    p.add_argument("--extra", action="append", default=[],
                   help='flags for our trainer only, as one string: --extra="--with_vtrace=True --num_epochs=2"')
    p.add_argument("--sf_extra", action="append", default=[], help="flags for Sample Factory only, as one string")
    p.add_argument("--variant", action="append", default=[],
                   help='one more training phase of ours with these flags added, in the same run (repeatable): '
                        '--variant="--mixed_precision=True"')
    p.add_argument("--phases", default=",".join(ALL_PHASES),
                   help=f"comma-separated subset of {','.join(ALL_PHASES)}")
    p.add_argument("--raw_processes", type=int, help="processes of the per-core raw phase (default: usable cores)")
    p.add_argument("--startup_timeout", type=float, default=120.0, help="seconds a trainer may take to its 1st frame")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs sf_core.train")
    p.add_argument("--work_dir", help="where train dirs and logs go (default: a temp dir, removed at the end)")
    add_bool_argument(p, "verbose", False, "echo the trainers' output")
    return p


def resolve_config(args) -> tuple[list[str], list[str], object]:
    """Our trainer's flags from the benchmark's, and the config they resolve to (presets included)."""
    from sf_core.config import ConfigError, parse_args

    cfg_argv = [f"--env={args.env}"]
    for name in ("num_workers", "num_envs_per_worker", "worker_num_splits", "rollout", "batch_size"):
        value = getattr(args, name)
        if value is not None:
            cfg_argv.append(f"--{name}={value}")
    if args.encoder_mlp_layers:
        cfg_argv += ["--encoder_mlp_layers", *[str(n) for n in args.encoder_mlp_layers]]
    extra = [flag for chunk in args.extra for flag in shlex.split(chunk)]
    try:
        cfg, _preset = parse_args(cfg_argv + extra)
    except ConfigError as exc:
        raise SystemExit(f"benchmark: the trainer rejects this configuration: {exc}")
    return cfg_argv, extra, cfg


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_info() -> dict:
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    return {"cpu_count": os.cpu_count(), "usable_cores": usable_cores(),
            "physical_cores": psutil.cpu_count(logical=False), "cpu_model": model,
            "memory_total_mb": round(psutil.virtual_memory().total / MB), "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_at_start": list(os.getloadavg())}  # other work on the machine skews every figure


def ratio(a, b):
    return round(a / b, 4) if a is not None and b else None


def compute_ratios(phases: dict) -> dict:
    fps = {name: (p.get("fps") if p.get("status") == "ok" else None) for name, p in phases.items()}
    raw1, ceiling = fps.get("raw_env_1proc"), fps.get("raw_env_per_core")
    sf = phases.get("sample_factory", {})
    sf_ok = sf.get("status") == "ok"
    train = phases.get("training", {})
    train_ok = train.get("status") == "ok"
    return {
        "sampling_vs_raw_1proc": ratio(fps.get("sampling"), raw1),
        "sampling_vs_ceiling": ratio(fps.get("sampling"), ceiling),
        "training_vs_raw_1proc": ratio(fps.get("training"), raw1),
        "training_vs_ceiling": ratio(fps.get("training"), ceiling),
        "training_vs_sampling": ratio(fps.get("training"), fps.get("sampling")),
        "raw_per_core_scaling": ratio(ceiling, raw1),
        "training_vs_sf": ratio(fps.get("training"), sf.get("fps") if sf_ok else None),
        "training_samples_trained_vs_sf": ratio(train.get("samples_trained_per_s") if train_ok else None,
                                                sf.get("samples_trained_per_s") if sf_ok else None),
        "sampling_vs_sf": ratio(fps.get("sampling"), sf.get("fps") if sf_ok else None),
        "sf_vs_ceiling": ratio(sf.get("fps") if sf_ok else None, ceiling),
        **{f"{name}_vs_sf": ratio(fps.get(name), sf.get("fps") if sf_ok else None)
           for name in phases if name.startswith("training_variant")},
    }


LABELS = {"raw_env_1proc": "raw env, 1 process", "raw_env_per_core": "raw env, 1 process per core",
          "sampling": "sf_core sampling only", "training": "sf_core training", "sample_factory": "Sample Factory"}


def table(results: dict) -> str:
    phases = results["phases"]
    raw1 = phases.get("raw_env_1proc", {}).get("fps")
    ceiling = phases.get("raw_env_per_core", {}).get("fps")
    head = ("phase", "frames/s", "x raw 1p", "x ceiling", "peak RSS MB", "notes")
    rows = []
    for name, p in phases.items():  # in the order they ran
        label = p.get("label") or LABELS.get(name, name)
        if name == "raw_env_per_core" and p.get("processes"):
            label = f"raw env, {p['processes']} processes"
        if name == "sample_factory" and p.get("version"):
            label = f"Sample Factory {p['version']}"
        if p.get("status") != "ok":
            rows.append((label, p.get("status", "?"), "", "", "", (p.get("reason") or p.get("error") or "")[:60]))
            continue
        notes = []
        trains = name.startswith("training") or name == "sample_factory"
        if trains and p.get("samples_trained_per_s") is not None:
            notes.append(f"trained {p['samples_trained_per_s']:,.0f}/s")
        if p.get("time_to_first_frame_s") is not None:
            notes.append(f"1st frame {p['time_to_first_frame_s']:.1f}s after launch")
        if name == "sample_factory" and p.get("first_status_with_frames_s") is not None:
            notes.append(f"1st FPS report with frames {p['first_status_with_frames_s']:.0f}s")
        if p.get("window") and not p["window"].get("complete"):
            notes.append("window incomplete")
        fps = p["fps"]
        rows.append((label, f"{fps:,.0f}", _fmt_ratio(fps, raw1), _fmt_ratio(fps, ceiling),
                     f"{p['peak_rss_mb']:,.0f}" if p.get("peak_rss_mb") is not None else "", "; ".join(notes)))
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    align = ["<", ">", ">", ">", ">", "<"]
    fmt = lambda r: "  ".join(f"{str(c):{a}{w}}" for c, a, w in zip(r, align, widths)).rstrip()  # noqa: E731
    lines = [fmt(head), fmt(tuple("-" * w for w in widths)), *[fmt(r) for r in rows]]
    return "\n".join(lines)


def _fmt_ratio(a, b) -> str:
    return f"{a / b:.2f}" if a is not None and b else ""


def write_json(path: str, results: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2, default=str)
    os.replace(tmp, path)


def _on_sigterm(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    phases_wanted = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases_wanted) - set(ALL_PHASES))
    if unknown:
        raise SystemExit(f"benchmark: unknown phases {unknown}; choose from {ALL_PHASES}")
    if args.seconds <= 0 or args.warmup < 0:
        raise SystemExit("benchmark: --seconds must be > 0 and --warmup >= 0")
    args.sf_extra_flags = [flag for chunk in args.sf_extra for flag in shlex.split(chunk)]
    cfg_argv, extra, cfg = resolve_config(args)
    raw_processes = args.raw_processes or usable_cores()
    raw_warmup = min(args.warmup, 1.0)

    work_dir = args.work_dir or tempfile.mkdtemp(prefix="sf_core_bench_")
    os.makedirs(work_dir, exist_ok=True)
    resolved = asdict(cfg)
    results: dict = {
        "benchmark": "sf_core throughput", "format_version": 1,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "finished": False,
        "machine": machine_info(),
        "settings": {"env": args.env, "seconds": args.seconds, "warmup": args.warmup,
                     "raw_warmup": raw_warmup, "raw_processes": raw_processes,
                     "report_interval": REPORT_INTERVAL_SEC, "memory_sample_interval": MEMORY_SAMPLE_SEC,
                     "trainer_flags": cfg_argv, "extra": extra, "sf_extra": args.sf_extra_flags,
                     "phases": phases_wanted,
                     "config": {k: resolved[k] for k in (
                         "env", "num_workers", "num_envs_per_worker", "worker_num_splits",
                         "policy_workers_per_policy", "rollout", "batch_size", "num_batches_per_epoch",
                         "num_epochs", "encoder_mlp_layers", "async_rl", "serial_mode", "device",
                         "env_frameskip", "torch_threads", "mp_start_method") if k in resolved}},
        "phases": {}, "ratios": {}, "commands": [],
        "notes": [
            "frames/s: env frames per second inside the timed window; raw phases count env.step calls "
            "(resets after episode ends are included in the time, not counted as frames)",
            "trainers: the timed window runs from the first status line at least --warmup s after the first "
            "one with frames > 0 to the first status line --seconds later (our trainer's own clock; SF's log "
            "timestamps); the run is then stopped with SIGINT (exit code 130 for ours, 2 for SF, is expected)",
            "time_to_first_frame_s: from the launch of the process (interpreter start-up and imports "
            "included); time_to_first_frame_trainer_s is the trainer's own figure, from its Runner's start",
            "peak RSS sums every process of the tree: shared pages (torch libraries, shared-memory buffers) "
            "count once per process; peak PSS counts them once",
            "Sample Factory: frames/s is its own FPS metric (env frames counted by its learner), read from "
            "its 5-second status lines, so its window edges are coarser",
        ],
    }
    phases = results["phases"]
    previous = {sig: signal.signal(sig, _on_sigterm) for sig in (signal.SIGTERM,)}
    status = 0
    print(f"benchmark: env {args.env}, {usable_cores()} usable cores, timed phases of {args.seconds:g}s after "
          f"{args.warmup:g}s warm-up; work dir {work_dir}", flush=True)

    def phase(name: str, fn: Callable[[], dict], command: str | None = None, label: str | None = None) -> None:
        print(f"-> {label or LABELS[name]} ...", flush=True)
        started = time.time()
        if command:
            results["commands"].append(command)
        try:
            phases[name] = fn()
        except (KeyboardInterrupt, Interrupted):
            phases[name] = {"status": "interrupted"}
            raise
        except Exception as exc:  # noqa: BLE001 - one failed phase must not lose the others
            phases[name] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc().splitlines()[-12:]}
        p = phases[name]
        if label:
            p["label"] = label
        if p.get("command") and p["command"] not in results["commands"]:
            results["commands"].append(p["command"])
        shown = f"{p['fps']:,.0f} frames/s" if p.get("fps") is not None else p.get("reason") or p.get("error", "")
        print(f"   {p['status']}: {shown} ({time.time() - started:.1f}s)", flush=True)

    try:
        if "raw" in phases_wanted:
            raw_desc = (f"{sys.executable} (in-process, multiprocessing spawn): step {args.env!r} with random "
                        f"actions for {raw_warmup:g}+{args.seconds:g}s")
            skip = cfg.env_frameskip
            phase("raw_env_1proc", lambda: run_raw_env(args.env, 1, raw_warmup, args.seconds, skip),
                  f"[raw_env_1proc] {raw_desc}, 1 process")
            phase("raw_env_per_core", lambda: run_raw_env(args.env, raw_processes, raw_warmup, args.seconds, skip),
                  f"[raw_env_per_core] {raw_desc}, {raw_processes} processes at once")
        if "sampling" in phases_wanted:
            phase("sampling", lambda: run_ours("sampling", args, cfg_argv, extra, work_dir, sampling_only=True))
        if "training" in phases_wanted:
            phase("training", lambda: run_ours("training", args, cfg_argv, extra, work_dir, sampling_only=False))
            for i, variant in enumerate(args.variant, 1):
                name, flags = f"training_variant_{i}", shlex.split(variant)
                phase(name, lambda: run_ours(name, args, cfg_argv, extra + flags, work_dir, sampling_only=False),
                      label=f"sf_core training {variant}")
        if "sf" in phases_wanted:
            phase("sample_factory", lambda: run_sf(args, cfg, work_dir))
        results["finished"] = True
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"\nbenchmark interrupted ({type(exc).__name__}): every subprocess was stopped; "
              f"writing the results so far", flush=True)
        results["interrupted"] = True
        status = 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        results["ratios"] = compute_ratios(phases)
        results["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        results["machine"]["load_average_at_end"] = list(os.getloadavg())
        results["table"] = table(results).splitlines()
        write_json(args.output, results)
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    print()
    print("\n".join(results["table"]))
    r = results["ratios"]
    if r.get("training_vs_sf") is not None:
        print(f"ours/SF training frames/s: {r['training_vs_sf']:.2f}")
    for i, variant in enumerate(args.variant, 1):
        if r.get(f"training_variant_{i}_vs_sf") is not None:
            print(f"ours ({variant})/SF training frames/s: {r[f'training_variant_{i}_vs_sf']:.2f}")
    print(f"\nresults: {args.output}" + (f"; logs in {work_dir}" if args.work_dir else ""))
    failed = [n for n, p in phases.items() if p.get("status") == "failed"]
    if failed and not status:
        print(f"failed phases: {', '.join(failed)}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
