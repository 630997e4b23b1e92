"""The Sample Factory 2.1.1 phase: the same configuration as ours, run from a separate interpreter.

Sample Factory lives in its own virtualenv (--sf_python), so nothing of it is imported here: it runs
scripts/sf_launcher.py (or --sf_module), and its progress is read from its console status lines, the
only report it gives while it runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from . import REPO
from .watch import LineParser, Timing, Watch, watch_process
from .window import Point, samples_rate, window_rates

LAUNCHER = os.path.join(REPO, "scripts", "sf_launcher.py")

# "[2023-06-19 08:22:20,123][01234] Fps is (10 sec: 4096.0, ...). Total num frames: 40960. Throughput: 0: 4000.0.
#  Samples: 40960. Policy #0 lag: (...)"
SF_STATUS = re.compile(r"Fps is \(.*?\)\. Total num frames: (?P<frames>\d+)\.(?:.*?Samples: (?P<samples>\d+))?")
SF_TIMESTAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")
SF_FINAL = re.compile(r"Collected \{(?P<steps>[^}]*)\}, FPS: (?P<fps>[0-9.]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
VERSION_PROBE = "import importlib.metadata as m, sample_factory; print(m.version('sample-factory'))"

if TYPE_CHECKING:
    from sf_core.config import Config


def sf_command(sf_python: str, launcher: str, cfg: Config, sf_extra: list[str], train_dir: str, bound_seconds: float,
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
    """A point from one of Sample Factory's "Fps is ..." status lines (None for any other line)."""
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


def line_parser(frameskip: int) -> LineParser:
    """parse_sf for a run at this frameskip, also catching SF's final "Collected ..., FPS:" line."""
    def parse(line: str, read_t: float, w: Watch) -> Point | None:
        final = SF_FINAL.search(ANSI.sub("", line))
        if final:
            w.extra["sf_final_fps"] = float(final["fps"])
        point = parse_sf(line, read_t, w)
        if point is not None:  # SF counts env frames including frameskip (summaries_use_frameskip); samples are steps
            point.trained = point.frames // max(1, frameskip)
        return point

    return parse


def probe_version(sf_python: str) -> str | dict:
    """Sample Factory's version under `sf_python`, or the phase's failed result if it has none."""
    probe = [sf_python, "-c", VERSION_PROBE]
    try:
        version = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"status": "failed", "error": f"cannot run {sf_python}: {exc}", "command": shlex.join(probe)}
    if version.returncode != 0:
        return {"status": "failed", "error": f"sample_factory not importable with {sf_python}",
                "output_tail": version.stderr.splitlines()[-10:], "command": shlex.join(probe)}
    return version.stdout.strip()


def resolve_python(value: str) -> str:
    """--sf_python as a command Sample Factory's working directory (not ours) can run: a name found on the PATH,
    and a path (./.sf_python) made absolute."""
    found = shutil.which(value) or value
    return os.path.abspath(found) if os.sep in found else found


def run_sf(args: argparse.Namespace, cfg: Config, work_dir: str) -> dict:
    """The Sample Factory phase ('not run' without --sf_python)."""
    if not args.sf_python:
        return {"status": "not run", "reason": "--sf_python not given"}
    sf_python = resolve_python(args.sf_python)
    sf_version = probe_version(sf_python)
    if isinstance(sf_version, dict):
        return sf_version
    if not sf_version.startswith("2.1"):
        print(f"  warning: {sf_python} has Sample Factory {sf_version}, not 2.1.x", flush=True)

    bound = args.startup_timeout + args.warmup + args.seconds + 60
    command = sf_command(sf_python, LAUNCHER, cfg, args.sf_extra_flags, os.path.join(work_dir, "sf_train_dir"),
                         bound, args.sf_module, args.sf_env)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)  # keep our repo's packages out of the other venv
    w = watch_process(command, Timing(args.warmup, args.seconds, args.startup_timeout),
                      os.path.join(work_dir, "sample_factory.log"), parse_line=line_parser(cfg.env_frameskip),
                      cwd=work_dir, env=env, echo=args.verbose)
    return sf_result(w, sf_version, args.warmup, args.seconds, shlex.join(command))


def sf_result(w: Watch, sf_version: str, warmup: float, seconds: float, command: str) -> dict:
    """The phase's JSON entry from what the watch collected."""
    rates = window_rates(w.points, w.first_frames_t, warmup, seconds)
    sampled = samples_rate(w.points, rates["window"]) if "window" in rates else None
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
        "warmup_seconds": warmup, "timed_seconds": seconds,
        **w.memory,
        "shm_files_left_behind": len(w.shm_removed),  # removed by the benchmark afterwards
        "command": command,
    }
    if not ok:
        result["error"] = rates.get("error") or f"exit code {w.exit_code}"
        result["output_tail"] = w.lines[-40:]
    return result
