"""One run of scripts/reproduce.py: an env's preset trained with one seed by `python -m sf_core.train` in a
subprocess, timed from launch to exit (the user's figure: interpreter start-up and the final checkpoint
included); then its learning curve, a deterministic evaluation of its final checkpoint and, on request, the
env's raw stepping rate over episodes as long as the run's.

A run's record is a JSON file, OUT/records/RUN_ID.json, written once a part is done; the parts are redone
only where the record lacks them (training, by far the longest, only when no record of it matches).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import REPO
from .proctree import kill_session, no_interrupts, send_signal
from .report import write_json

FORMAT_VERSION = 1
STOP_GRACE_SEC = 30.0  # after Ctrl-C, how long the trainer may take to save its checkpoint and exit
LOG_TAIL_LINES = 30
RAW_PROCESSES = 2  # the raw rate is measured with as many env processes as the 2-core machines train with
RAW_WARMUP_SEC = 1.0
TAG = "episode/return"  # the trainer's mean return of the last --stats_window (100) episodes, step = env frames


@dataclass(frozen=True)
class RunSpec:
    """What identifies a run: env, seed, the frames it trains for, the extra trainer flags and the trainer's
    values for them (`config`, a digest: a preset changed since a record was made invalidates it).
    `budget_from`: "--frames", "trainer" (its own budget: the preset's, or --extra's) or "references" (the env has
    no preset budget: the published one, passed to the trainer)."""

    suite: str
    env: str
    seed: int
    budget: int
    budget_from: str
    extra: tuple[str, ...] = ()
    config: str = ""  # a digest of the trainer's values for the env (reproduce.config_digest)

    @property
    def run_id(self) -> str:
        name = f"{self.env.replace('/', '_')}_s{self.seed}"
        if self.budget_from == "--frames":
            name += f"_f{self.budget}"
        if self.extra:
            name += "_x" + hashlib.sha1(shlex.join(self.extra).encode()).hexdigest()[:8]
        return name

    def command(self, train_dir: str) -> list[str]:
        budget = [] if self.budget_from == "trainer" else [f"--train_for_env_steps={self.budget}"]
        return [sys.executable, "-m", "sf_core.train", f"--env={self.env}", f"--seed={self.seed}",
                f"--train_dir={train_dir}", f"--experiment={self.run_id}", *budget, *self.extra,
                "--restart_behavior=overwrite"]  # last: a run is only ever started afresh

    def trained_by(self, record: dict | None) -> bool:
        """Whether `record` holds this run's training (a preset whose values changed since does not)."""
        return bool(record) and record.get("format_version") == FORMAT_VERSION and "status" in record and all(
            record.get(k) == v for k, v in (("env", self.env), ("seed", self.seed), ("budget_frames", self.budget),
                                            ("extra", list(self.extra)), ("config", self.config)))


def record_path(out: str, spec: RunSpec) -> str:
    return os.path.join(out, "records", f"{spec.run_id}.json")


def load_record(out: str, spec: RunSpec) -> dict | None:
    try:
        with open(record_path(out, spec), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if spec.trained_by(record) else None


def save_record(out: str, spec: RunSpec, record: dict) -> None:
    write_json(record_path(out, spec), record)


def train(spec: RunSpec, out: str) -> dict:
    """Run the trainer and return the run's record: how it ended and, if it succeeded, what it reached."""
    train_dir, log_path = os.path.join(out, "runs"), os.path.join(out, "logs", f"{spec.run_id}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    command = spec.command(train_dir)
    record: dict[str, Any] = {"format_version": FORMAT_VERSION, "run_id": spec.run_id, "suite": spec.suite,
                              "env": spec.env, "seed": spec.seed, "budget_frames": spec.budget,
                              "budget_from": spec.budget_from, "extra": list(spec.extra), "config": spec.config,
                              "command": shlex.join(command), "log": os.path.relpath(log_path, out),
                              "launched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    exit_code, wall, launched = launch(command, log_path)
    record["exit_code"], record["wall_seconds"] = exit_code, round(wall, 2)
    experiment = os.path.join(train_dir, spec.run_id)
    summary = _read_json(os.path.join(experiment, "training_summary.json"))
    if exit_code != 0 or summary is None:
        record["status"] = "failed"
        record["log_tail"] = _tail(log_path, LOG_TAIL_LINES)
        return record
    record["status"] = "ok"
    record["training"] = trained(summary, wall, _read_json(os.path.join(experiment, "config.json")) or {})
    record["curve"] = read_curve(experiment, launched)
    return record


def launch(command: list[str], log_path: str) -> tuple[int, float, float]:
    """Run `command` with its console in `log_path`: (exit code, seconds from launch to exit, time.time()
    at launch). Interrupted (Ctrl-C), it stops the trainer as Ctrl-C would, and kills what is left."""
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(command) + "\n")
        log.flush()
        launched, started = time.time(), time.perf_counter()
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            exit_code = proc.wait()
        except BaseException:
            with no_interrupts():
                send_signal(proc, signal.SIGINT)
                try:
                    proc.wait(timeout=STOP_GRACE_SEC)
                except subprocess.TimeoutExpired:
                    pass
                kill_session(proc.pid, launched)
            raise
        wall = time.perf_counter() - started
    kill_session(proc.pid, launched)  # anything its processes left behind
    return exit_code, wall, launched


def trained(summary: dict, wall: float, config: dict) -> dict:
    """What the run reached, from its training_summary.json; frames/s from its first frame to its stop."""
    frames, seconds = summary.get("frames") or 0, summary.get("seconds") or 0.0
    sampling = seconds - (summary.get("time_to_first_frame") or 0.0)
    return {"frames": frames, "final_return": summary.get("mean_return"), "episodes": summary.get("episodes"),
            "mean_length": summary.get("mean_length"), "trainer_seconds": round(seconds, 2),
            "time_to_first_frame": summary.get("time_to_first_frame"),
            "fps": round(frames / sampling, 1) if sampling > 0 else None,
            "fps_launch_to_exit": round(frames / wall, 1) if wall > 0 else None,
            "env_frameskip": config.get("env_frameskip", 1), "preset": config.get("preset") or None,
            "summary_interval": config.get("experiment_summaries_interval"),
            "stats_window": config.get("stats_window")}


def read_curve(experiment: str, launched: float) -> dict:
    """The trainer's 100-episode mean return at each of its TensorBoard summaries: env frames, and wall-clock
    seconds since the launch of the process (the events' own timestamps)."""
    from sf_core.cli.plot import read_scalars

    scalars = read_scalars(experiment)
    events = scalars.Scalars(TAG) if TAG in scalars.Tags()["scalars"] else []
    return {"frames": [int(e.step) for e in events], "seconds": [round(e.wall_time - launched, 2) for e in events],
            "returns": [round(float(e.value), 4) for e in events]}


def evaluate(out: str, spec: RunSpec, episodes: int) -> dict:
    """The final checkpoint, `episodes` episodes with the most likely actions (Stable-Baselines3's
    evaluate_policy), reset with the seeds --eval_every_env_steps uses, apart from training's."""
    import sf_core
    from sf_core.sampling.periodic_evaluator import EVAL_SEED_OFFSET

    started = time.perf_counter()
    seed = spec.seed + EVAL_SEED_OFFSET
    try:
        policy = sf_core.load_policy(os.path.join(out, "runs", spec.run_id), checkpoint="latest")
        returns, lengths = sf_core.evaluate_policy(policy, n_eval_episodes=episodes, seed=seed,
                                                   return_episode_rewards=True)
    except Exception as exc:  # noqa: BLE001 - recorded: the other runs go on
        return {"episodes": episodes, "error": f"{type(exc).__name__}: {exc}"}
    return {"episodes": episodes, "mean": round(float(np.mean(returns)), 4), "std": round(float(np.std(returns)), 4),
            "returns": [round(float(r), 4) for r in returns], "lengths": [int(n) for n in lengths],
            "deterministic": True, "checkpoint": "latest", "first_seed": seed,
            "seconds": round(time.perf_counter() - started, 2)}


def raw_rate(spec: RunSpec, training: dict, seconds: float) -> dict:
    """The env alone in RAW_PROCESSES processes with random actions, its episodes as long as the run's mean
    episode (terminated ignored), so it resets as often per frame as training did; and training's ratio to it."""
    from .raw_env import run_raw_env

    length = training.get("mean_length")
    episode_length = max(1, round(length)) if length else None
    try:
        raw = run_raw_env(spec.env, RAW_PROCESSES, RAW_WARMUP_SEC, seconds, training.get("env_frameskip") or 1,
                          episode_length)
    except Exception as exc:  # noqa: BLE001 - recorded: the other runs go on
        return {"error": f"{type(exc).__name__}: {exc}", "seconds": seconds}
    fps = raw["fps"]
    ratio = round(training["fps"] / fps, 4) if fps and training.get("fps") else None
    return {"fps": round(fps, 1), "training_vs_raw": ratio, "processes": RAW_PROCESSES, "seconds": seconds,
            "episode_length": episode_length, "resets": raw["resets"], "fps_per_process": raw["fps_per_process"]}


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _tail(path: str, lines: int) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in f.readlines()[-lines:]]
    except OSError:
        return []
