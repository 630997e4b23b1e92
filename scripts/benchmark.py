#!/usr/bin/env python
"""Throughput benchmark: sf_core against raw env stepping (and, optionally, Sample Factory 2.1.1).

Phases, one after another on the same machine:

  raw_env_1proc     one process stepping one env with random actions: the per-core baseline
  raw_env_per_core  one such process per usable core, all at once: the machine's ceiling
  sampling          `python -m sf_core.train ... --sampling_only=True` (rollout + inference + batcher, no SGD)
  training          `python -m sf_core.train ...` (full APPO): env frames/s, samples trained/s, time to 1st frame
  sample_factory    Sample Factory 2.1.1 with the same configuration, if --sf_python points at a Python
                    that has it installed (a separate venv); otherwise reported as 'not run'
  first_frame       (--phases=first_frame) the trainer's first frame after launch beside a bare `import torch`
                    with the collector off, --launches times in turns (scripts/benchlib/first_frame.py)
  cluster_*         on a Ray cluster of one or two nodes on this machine (--phases=...,cluster; needs Ray and
                    root for `unshare -n`): the cost of the cluster path, and two nodes of a slow env against
                    one (scripts/benchlib/cluster.py)

Frames per second exclude a warm-up. For the trainers they come from the progress they report while
they run, not from the final summary: ours rewrites training_summary.json every second
(`--experiment_summaries_interval=1`, its own clock and counters; its console lines go to the log),
Sample Factory prints a status line every 5 s. The timed window opens at the first report at least
--warmup seconds after the first one that shows frames (start-up is reported separately, as time to
first frame) and closes at the first report --seconds later; FPS = (frames at close - frames at open)
/ (time between them). Then the trainer is stopped the way Ctrl-C stops it (SIGINT: it finishes
cleanly and writes its final training_summary.json); --train_for_seconds is only a safety bound. Raw
env phases count env steps in [min(warmup, 1 s), that + --seconds] in every process.

Instead of the phases, --sweep runs the training phase once per point of a small grid over
--num_workers, --num_envs_per_worker and --policy_workers_per_policy (the trainer's own configuration
included) and prints the best flags for this machine and env (scripts/benchlib/sweep.py);
--scaling=2,4,8,16 runs it at each --num_workers, with --plot=PATH.png a plot (scripts/benchlib/scaling.py).

Peak memory is the largest sum of RSS (and of PSS, which counts shared pages once) over the phase's
processes and all their descendants, sampled every 0.5 s.

Example:
    python scripts/benchmark.py --env=CartPole-v1 --num_workers=2 --seconds=30 --warmup=5 \\
        --sf_python=/path/to/sf_venv/bin/python --output=benchmark_results.json
Flags for our trainer only: --extra="--with_vtrace=True --num_epochs=2" (repeatable); for SF: --sf_extra.
The parts live in scripts/benchlib/; Sample Factory runs scripts/sf_launcher.py with its own interpreter.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
from typing import TYPE_CHECKING, Callable

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(SCRIPTS)
for _path in (REPO, SCRIPTS):  # sf_core and benchlib, however this file is run or loaded
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchlib.first_frame import run_first_frame  # noqa: E402
from benchlib.ours import run_ours  # noqa: E402
from benchlib.proctree import Interrupted  # noqa: E402
from benchlib.raw_env import run_raw_env  # noqa: E402
from benchlib.report import LABELS, finish, int_list, median_round, new_results, usable_cores, write_json  # noqa: E402
from benchlib.sample_factory import run_sf  # noqa: E402
from benchlib import scaling, sweep  # noqa: E402
from sf_core.run.time_accounting import accounting_lines  # noqa: E402

if TYPE_CHECKING:
    from sf_core.config import Config

ALL_PHASES = ("raw", "sampling", "training", "sf", "cluster", "first_frame")
DEFAULT_PHASES = ("raw", "sampling", "training", "sf")


def build_parser() -> argparse.ArgumentParser:
    from sf_core.cli.arguments import add_bool_argument

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1", help="gymnasium id (or name registered with sf_core)")
    p.add_argument("--num_workers", type=int, help="rollout workers (default: the trainer's)")
    p.add_argument("--num_envs_per_worker", type=int, help="envs per worker (default: the trainer's/preset's)")
    p.add_argument("--worker_num_splits", type=int, help="splits per worker (default: the trainer's)")
    p.add_argument("--rollout", type=int, help="rollout length (default: the trainer's/preset's)")
    p.add_argument("--batch_size", type=int, help="SGD minibatch size (default: the trainer's/preset's)")
    p.add_argument("--encoder_mlp_layers", type=int, nargs="+", help="MLP encoder sizes, e.g. 512 512")
    p.add_argument("--seconds", type=float, default=30.0, help="duration of each timed phase (after warm-up)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every phase this many times in turn and report each phase's median round (on a "
                        "noisy machine, for ratios between phases)")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds excluded from FPS, counted from the first frame (raw env phases: min(warmup, 1))")
    p.add_argument("--output", default="benchmark_results.json", help="JSON results path")
    p.add_argument("--sf_python", help="python of a separate venv with sample-factory 2.1.1; absent: SF not run")
    p.add_argument("--sf_env", help="the env's id for Sample Factory where its gymnasium 0.29 names it differently "
                                    "(HalfCheetah-v4 for our HalfCheetah-v5: same model, dynamics and spaces)")
    p.add_argument("--sf_module", help="run SF as `python -m MODULE` (e.g. sf_examples.train_gym_env, which "
                                       "registers only CartPole-v1) instead of scripts/sf_launcher.py")
    p.add_argument("--extra", action="append", default=[],
                   help='flags for our trainer only, as one string: --extra="--with_vtrace=True --num_epochs=2"')
    p.add_argument("--sf_extra", action="append", default=[], help="flags for Sample Factory only, as one string")
    p.add_argument("--variant", action="append", default=[],
                   help='one more sampling and training phase of ours (those asked for) with these flags added, in '
                        'the same run (repeatable): --variant="--mixed_precision=True"')
    p.add_argument("--baseline_repo", help="a checkout of another commit (e.g. `git worktree add ../base HEAD~1`): "
                                           "its trainer runs the training phase too, right after ours, in the same "
                                           "run (training_baseline; ratio training_vs_baseline). It must write "
                                           "training_summary.json while running, as this version does")
    p.add_argument("--phases", default=",".join(DEFAULT_PHASES),
                   help=f"comma-separated subset of {','.join(ALL_PHASES)}")
    p.add_argument("--cluster_cases", help="comma-separated subset of the cluster phase's cases (default: all)")
    p.add_argument("--raw_processes", type=int, help="processes of the per-core raw phase (default: usable cores)")
    p.add_argument("--startup_timeout", type=float, default=120.0, help="seconds a trainer may take to its 1st frame")
    p.add_argument("--launches", type=int, default=8,
                   help="first_frame phase: launches of each (the bare torch import, each trainer), in turns, "
                        "after one uncounted turn")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs sf_core.train")
    p.add_argument("--work_dir", help="where train dirs and logs go (default: a temp dir, removed at the end)")
    add_bool_argument(p, "verbose", False, "echo the trainers' output")
    add_bool_argument(p, "sweep", False,
                      "instead of the phases: the training phase at each point of a small grid over --num_workers "
                      "(cores/2, cores, 2 x cores), --num_envs_per_worker (the trainer's, twice that) and "
                      "--policy_workers_per_policy (1, 2 from 8 cores up), and the trainer's defaults; prints the "
                      "best flags for this machine and env")
    p.add_argument("--sweep_num_workers", help="--sweep's --num_workers values instead of the defaults, e.g. 2,4")
    p.add_argument("--sweep_num_envs_per_worker", help="--sweep's --num_envs_per_worker values, e.g. 8,16 (each "
                                                       "rounded up to a multiple of --worker_num_splits)")
    p.add_argument("--sweep_policy_workers", help="--sweep's --policy_workers_per_policy values, e.g. 1,2")
    p.add_argument("--scaling", help="instead of the phases: the training phase at each of these --num_workers, "
                                     "e.g. 2,4,8,16, with frames/s per worker")
    p.add_argument("--plot", help="with --scaling: write a PNG plot of frames/s against workers here")
    return p


def resolve_config(args: argparse.Namespace) -> tuple[list[str], list[str], Config]:
    """Our trainer's flags from the benchmark's, and the config they resolve to (presets included)."""
    from sf_core.cli.arguments import parse_args
    from sf_core.config import ConfigError

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


class Benchmark:
    """One run of the benchmark: its settings, the results document, and the phases in their order."""

    def __init__(self, args: argparse.Namespace, cfg_argv: list[str], extra: list[str], cfg: Config,
                 work_dir: str):
        self.args, self.cfg_argv, self.extra, self.cfg, self.work_dir = args, cfg_argv, extra, cfg, work_dir
        self.phases_wanted = wanted_phases(args)
        self.raw_processes = args.raw_processes or usable_cores()
        self.raw_warmup = min(args.warmup, 1.0)
        self.rounds: dict[str, list[dict]] = {}  # phase -> its result in each round so far (--rounds > 1)
        self.results = new_results(args, self.cfg, self.cfg_argv, self.extra, self.phases_wanted,
                                   self.raw_processes, self.raw_warmup)
        self.sweep = sweep.plan(args, cfg, cfg_argv, extra, usable_cores()) if args.sweep else None
        self.scaling = scaling.plan(args.scaling_workers, cfg_argv, extra) if args.scaling else None
        if self.sweep:
            self.results["settings"].update(phases=["sweep"], sweep_axes=self.sweep.axes)
            for note in self.sweep.notes:
                print(f"sweep: {note}", flush=True)
        if self.scaling:
            self.results["settings"].update(phases=["scaling"], scaling_workers=args.scaling_workers)

    def run_all(self) -> None:
        """Every phase asked for, --rounds times in turn (so the machine's drift falls on every phase alike);
        a failed phase is recorded and the next runs, an interruption propagates."""
        for number in range(1, self.args.rounds + 1):
            if self.args.rounds > 1:
                print(f"round {number} of {self.args.rounds}", flush=True)
            self.run_round()

    def run_round(self) -> None:
        if self.sweep:
            sweep.run_sweep(self, self.sweep)
        elif self.scaling:
            scaling.run_scaling(self, self.scaling)
        else:
            self.run_phases()

    def run_phases(self) -> None:
        args, wanted = self.args, self.phases_wanted
        if "raw" in wanted:
            raw_desc = (f"{sys.executable} (in-process, multiprocessing spawn): step {args.env!r} with random "
                        f"actions for {self.raw_warmup:g}+{args.seconds:g}s")
            skip, many = self.cfg.env_frameskip, self.raw_processes
            self.phase("raw_env_1proc", lambda: run_raw_env(args.env, 1, self.raw_warmup, args.seconds, skip),
                       f"[raw_env_1proc] {raw_desc}, 1 process")
            self.phase("raw_env_per_core", lambda: run_raw_env(args.env, many, self.raw_warmup, args.seconds, skip),
                       f"[raw_env_per_core] {raw_desc}, {many} processes at once")
        if "sampling" in wanted:
            self.phase("sampling", lambda: self.ours("sampling", self.extra, sampling_only=True))
            for i, variant in enumerate(args.variant, 1):
                name, flags = f"sampling_variant_{i}", shlex.split(variant)
                self.phase(name, lambda: self.ours(name, self.extra + flags, sampling_only=True),
                           label=f"sf_core sampling {variant}")
        if "training" in wanted:
            self.phase("training", lambda: self.ours("training", self.extra, sampling_only=False))
            if args.baseline_repo:
                self.phase("training_baseline", lambda: run_ours("training_baseline", args, self.cfg_argv, self.extra,
                                                                 self.work_dir, False, repo=args.baseline_repo),
                           label=f"sf_core training from {args.baseline_repo}")
            for i, variant in enumerate(args.variant, 1):
                name, flags = f"training_variant_{i}", shlex.split(variant)
                self.phase(name, lambda: self.ours(name, self.extra + flags, sampling_only=False),
                           label=f"sf_core training {variant}")
        if "sf" in wanted:
            self.phase("sample_factory", lambda: run_sf(args, self.cfg, self.work_dir))
        if "first_frame" in wanted:
            self.phase("first_frame", lambda: run_first_frame(args, self.cfg_argv, self.extra, self.work_dir))
        if "cluster" in wanted:
            from benchlib.cluster import CASES, run_case

            for case in (args.cluster_cases.split(",") if args.cluster_cases else CASES):
                self.phase(case, lambda: run_case(case, args, self.cfg_argv, self.extra, self.work_dir),
                           label=f"sf_core on Ray: {case}")

    def ours(self, name: str, extra: list[str], sampling_only: bool) -> dict:
        return run_ours(name, self.args, self.cfg_argv, extra, self.work_dir, sampling_only)

    def phase(self, name: str, fn: Callable[[], dict], command: str | None = None, label: str | None = None) -> None:
        """Run one phase and record its result under `name`, whatever happens to it."""
        results, phases = self.results, self.results["phases"]
        print(f"-> {label or LABELS[name]} ...", flush=True)
        started = time.time()
        if command and command not in results["commands"]:
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
        if self.args.rounds > 1:
            self.rounds.setdefault(name, []).append(p)
            phases[name] = median_round(self.rounds[name])
        if p.get("command") and p["command"] not in results["commands"]:
            results["commands"].append(p["command"])
        shown = (f"{p['fps']:,.0f} frames/s" if p.get("fps") is not None
                 else p.get("line") or p.get("reason") or p.get("error", ""))
        print(f"   {p['status']}: {shown} ({time.time() - started:.1f}s)", flush=True)


def wanted_phases(args: argparse.Namespace) -> list[str]:
    return [p.strip() for p in args.phases.split(",") if p.strip()]


def check_args(args: argparse.Namespace) -> None:
    """Reject what no phase could run with; also split --sf_extra into flags."""
    unknown = sorted(set(wanted_phases(args)) - set(ALL_PHASES))
    if unknown:
        raise SystemExit(f"benchmark: unknown phases {unknown}; choose from {ALL_PHASES}")
    if args.seconds <= 0 or args.warmup < 0 or args.rounds < 1 or args.launches < 1:
        raise SystemExit("benchmark: --seconds must be > 0, --warmup >= 0, --rounds >= 1 and --launches >= 1")
    args.sf_extra_flags = [flag for chunk in args.sf_extra for flag in shlex.split(chunk)]
    if args.baseline_repo and not os.path.exists(os.path.join(args.baseline_repo, "sf_core", "train.py")):
        raise SystemExit(f"benchmark: --baseline_repo={args.baseline_repo} is not a checkout of sf_core")
    check_modes(args)


def check_modes(args: argparse.Namespace) -> None:
    """--sweep and --scaling: one at a time, their lists well formed, no option of theirs without them."""
    if args.sweep and args.scaling:
        raise SystemExit("benchmark: --sweep and --scaling are separate runs: give one of them")
    given = [f"--{option}" for option in sweep.OVERRIDES.values() if getattr(args, option)]
    if given and not args.sweep:
        raise SystemExit(f"benchmark: {', '.join(given)} given without --sweep")
    if args.plot and not args.scaling:
        raise SystemExit("benchmark: --plot draws the --scaling run: give --scaling too")
    sweep.parse_overrides(args)  # a malformed list stops the run here, before any work dir exists
    args.scaling_workers = int_list(args.scaling, "scaling") if args.scaling else None


def keep_logs(work_dir: str, args: argparse.Namespace) -> str:
    """Each run's log, kept beside the results (a temporary work dir goes): {output without .json}_logs/."""
    if args.work_dir is not None:
        return work_dir
    logs = os.path.splitext(args.output)[0] + "_logs"
    os.makedirs(logs, exist_ok=True)
    for name in os.listdir(work_dir):
        if name.endswith(".log"):
            shutil.copy(os.path.join(work_dir, name), logs)
    return logs


def print_summary(results: dict, args: argparse.Namespace, work_dir: str) -> None:
    print()
    if args.sweep or args.scaling:
        print_mode_summary(results, args, work_dir)
        return
    for name, phase in results["phases"].items():  # where our trainer's time went, phase by phase
        summary = phase.get("summary") or {}
        if summary.get("time_accounting"):
            print(f"{name}: " + "\n  ".join(accounting_lines(summary["time_accounting"], summary.get("startup", {}))))
    print("\n".join(results["table"]))
    r = results["ratios"]
    if r.get("training_vs_sf") is not None:
        print(f"ours/SF training frames/s: {r['training_vs_sf']:.2f}")
    if r.get("training_vs_baseline") is not None:
        print(f"ours/{args.baseline_repo} training frames/s: {r['training_vs_baseline']:.2f}")
    for key, what in (("cluster_vs_training", "one sampler on Ray / one machine"),
                      ("slow_2_nodes_vs_1_node", "slow env, two nodes / one node")):
        if r.get(key) is not None:
            print(f"{what}, frames/s: {r[key]:.2f}")
    for i, variant in enumerate(args.variant, 1):
        if r.get(f"training_variant_{i}_vs_sf") is not None:
            print(f"ours ({variant})/SF training frames/s: {r[f'training_variant_{i}_vs_sf']:.2f}")
    print(f"\nresults: {args.output}; logs in {results.get('logs', work_dir)}")


def print_mode_summary(results: dict, args: argparse.Namespace, work_dir: str) -> None:
    """--sweep's or --scaling's table; the sweep's best point comes last, so it is the last line of output."""
    print(f"results: {args.output}; logs in {results.get('logs', work_dir)}")
    if args.sweep:
        print("\n".join(sweep.report_lines(results.get("sweep", []), args.env)))
        return
    print("\n".join(scaling.report_lines(results.get("scaling", []))))
    if args.plot:
        device = scaling.device_name(results["settings"]["config"]["device"])
        title = scaling.plot_title(args.env, usable_cores(), device)
        wrote = scaling.write_plot(results.get("scaling", []), args.plot, title)
        print(f"plot: {args.plot}" if wrote else "no plot: no worker count measured frames/s")


def _on_sigterm(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    cfg_argv, extra, cfg = resolve_config(args)  # before the work dir: a rejected config leaves none behind
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="sf_core_bench_")
    os.makedirs(work_dir, exist_ok=True)
    bench = Benchmark(args, cfg_argv, extra, cfg, work_dir)
    results, status = bench.results, 0
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    print(f"benchmark: env {args.env}, {usable_cores()} usable cores, timed phases of {args.seconds:g}s after "
          f"{args.warmup:g}s warm-up; work dir {work_dir}", flush=True)
    try:
        bench.run_all()
        results["finished"] = True
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"\nbenchmark interrupted ({type(exc).__name__}): every subprocess was stopped; "
              f"writing the results so far", flush=True)
        results["interrupted"] = True
        status = 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        finish(results)
        write_json(args.output, results)
        results["logs"] = keep_logs(work_dir, args)
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    print_summary(results, args, work_dir)
    failed = [n for n, p in results["phases"].items() if p.get("status") == "failed"]
    if failed and not status:
        print(f"failed phases: {', '.join(failed)}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
