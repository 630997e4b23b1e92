#!/usr/bin/env python
"""Reproduce the published scores: each env's preset trained per seed, timed from launch to exit, evaluated, and
set beside the peers' published tables (scripts/benchlib/published_scores.json).

    python scripts/reproduce.py --suite=mujoco --seeds=1,2,3
    python scripts/reproduce.py --suite=classic --seeds=1 --frames=40000 --eval_episodes=2 --out=/tmp/repro

For each env of the suite (or --envs) and each seed, one run after another, never two at once:
`python -m sf_core.train --env=E --seed=S --train_dir=OUT/runs --experiment=E_sS [--train_for_env_steps=N]
[--extra flags]`, its console in OUT/logs/E_sS.log. The budget is --frames, else the trainer's own (the env's
preset), else, for an env with no preset budget, the published one. Each run records its 100-episode mean
training return against env frames and wall-clock seconds since launch (its TensorBoard summaries), where that
first reaches each published score, its final training return, frames, frames/s and launch-to-exit seconds;
then a deterministic evaluation of its final checkpoint (--eval_episodes, Stable-Baselines3 style, seeds apart
from training's) and, with --raw_rate, the env's raw stepping rate in 2 processes over episodes as long as the
run's.

OUT holds records/ (one JSON file per run), results.json, results.md (a table per suite, ready for
docs/results.md) and plots/ENV.png. Rerun the same command to go on after an interruption: a run with a
complete record is not run again (an interrupted one starts afresh), and the outputs are rebuilt.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shlex
import signal
import sys

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(SCRIPTS)
for _path in (REPO, SCRIPTS):  # sf_core and benchlib, however this file is run or loaded
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchlib import published, reproduction as repro  # noqa: E402
from benchlib.proctree import Interrupted  # noqa: E402
from benchlib.published import PublishedScores, UsageError  # noqa: E402
from benchlib.report import write_json  # noqa: E402
from benchlib.reproduction_plot import plot_env  # noqa: E402
from benchlib.reproduction_report import build_results, frames_text, markdown, run_context, seconds_text  # noqa: E402

RAW_SECONDS = 10.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"reproduce: error: {message}\n")  # one line, as for every other bad input


def build_parser() -> argparse.ArgumentParser:
    from sf_core.cli.arguments import add_bool_argument

    p = _Parser(prog="python scripts/reproduce.py", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="", help="classic, mujoco or atari (a comma list runs several)")
    p.add_argument("--envs", default="", help="only these envs, comma-separated (a suite's envs, or its extra "
                                              "ones in published_scores.json, e.g. Swimmer-v5)")
    p.add_argument("--seeds", default="1,2,3", help="training seeds, comma-separated")
    p.add_argument("--frames", type=int, help="env frames per run (default: the preset's budget); a run with "
                                              "another budget is another record")
    p.add_argument("--out", default="reproduce_out", help="output folder (records, logs, runs, results, plots)")
    p.add_argument("--eval_episodes", type=int, default=10, help="episodes of the final evaluation")
    add_bool_argument(p, "raw_rate", False,
                      "also measure the env's raw stepping rate in 2 processes, episodes as long as the run's")
    p.add_argument("--raw_seconds", type=float, default=RAW_SECONDS, help="seconds timed by --raw_rate per run")
    p.add_argument("--extra", default="", help='more trainer flags, one string: --extra="--num_workers=4"; a run '
                                               "with other flags is another record")
    return p


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds takes distinct integers ≥ 0 separated by commas, got {text!r}")
    return seeds


def plan_runs(args: argparse.Namespace, scores: PublishedScores) -> list[repro.RunSpec]:
    """Every run the command asks for, envs in suite order and seeds within each env; UsageError if any
    part of the command line cannot run."""
    seeds = parse_seeds(args.seeds)
    if args.frames is not None and args.frames < 1:
        raise UsageError(f"--frames takes a positive number of env frames, got {args.frames}")
    if args.eval_episodes < 1 or args.raw_seconds <= 0:
        raise UsageError("--eval_episodes and --raw_seconds must be positive")
    try:
        extra = tuple(shlex.split(args.extra))
    except ValueError as exc:
        raise UsageError(f"--extra: {exc}") from None
    chosen = scores.select(_names(args.suite), _names(args.envs))
    budgets = {env: budget_for(env, args.frames, extra, scores) for _, env in chosen}
    # seed by seed: a suite cut short still has every env's first seeds
    return [repro.RunSpec(suite, env, seed, *budgets[env], extra, config_digest(env, extra))
            for seed in seeds for suite, env in chosen]


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def budget_for(env: str, frames: int | None, extra: tuple[str, ...], scores: PublishedScores) -> tuple[int, str]:
    """(frames, where the number comes from): --frames; else the trainer's own (the preset's, or --extra's);
    else the largest published budget. The trainer's flags are checked here, before any run starts."""
    from sf_core.cli.arguments import parse_args
    from sf_core.config import Config, ConfigError

    try:
        cfg, _preset = parse_args([f"--env={env}", *extra])
    except ConfigError as exc:
        raise UsageError(f"the trainer rejects --env={env} {shlex.join(extra)}: {exc}") from None
    if frames is not None:
        return frames, "--frames"
    unbounded = next(f.default for f in dataclasses.fields(Config) if f.name == "train_for_env_steps")
    if cfg.train_for_env_steps != unbounded:
        return cfg.train_for_env_steps, "trainer"
    published_budgets = [ref.budget_frames for ref in scores.references(env) if ref.budget_frames]
    if not published_budgets:
        raise UsageError(f"{env} has neither a preset budget nor a published one: pass --frames")
    return max(published_budgets), "references"


def config_digest(env: str, extra: tuple[str, ...]) -> str:
    """What the trainer will run with for `env` (its preset, the defaults, --extra), but the seed and the
    folders, as a short hash: a record made with other values (a preset tuned since) is trained again."""
    from sf_core.cli.arguments import parse_args

    cfg, _preset = parse_args([f"--env={env}", *extra])
    values = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in RUN_NAMING}
    return hashlib.sha1(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:12]


RUN_NAMING = ("seed", "train_dir", "experiment", "restart_behavior", "train_for_env_steps")


class Progress:
    """Runs done and an estimate of the time left: each run still to train is taken to last as long as the
    mean of this env's runs so far (its records included)."""

    def __init__(self, specs: list[repro.RunSpec], out: str):
        self.total = len(specs)
        self.to_train = [s for s in specs if repro.load_record(out, s) is None]
        self.seconds: dict[str, list[float]] = {}

    def note(self, record: dict) -> None:
        self.seconds.setdefault(record["env"], []).append(record["wall_seconds"])
        self.to_train = [s for s in self.to_train if s.run_id != record["run_id"]]

    def left(self) -> str:
        known = [sum(self.seconds[s.env]) / len(self.seconds[s.env]) for s in self.to_train if s.env in self.seconds]
        unknown = len(self.to_train) - len(known)
        if not self.to_train:
            return "nothing left to train"
        text = f"about {seconds_text(sum(known))} left" if known else "time left unknown"
        return text + (f", and {unknown} run{'s' if unknown > 1 else ''} of envs not yet timed" if known and unknown
                       else "")


def run_one(spec: repro.RunSpec, out: str, args: argparse.Namespace, head: str, progress: Progress) -> dict:
    """The run's complete record: what is recorded already, with whatever part is missing done now."""
    record = repro.load_record(out, spec)
    skipped = record is not None
    if record is None:
        print(f"{head}: training, {frames_text(spec.budget)} frames ({spec.budget_from}); {progress.left()}",
              flush=True)
        record = repro.train(spec, out)
        repro.save_record(out, spec, record)
    if record["status"] == "ok" and (record.get("evaluation") or {}).get("episodes") != args.eval_episodes:
        record["evaluation"] = repro.evaluate(out, spec, args.eval_episodes)
        repro.save_record(out, spec, record)
    if record["status"] == "ok" and args.raw_rate and (record.get("raw") or {}).get("seconds") != args.raw_seconds:
        record["raw"] = repro.raw_rate(spec, record["training"], args.raw_seconds)
        repro.save_record(out, spec, record)
    progress.note(record)
    print(f"{head}: {outcome(record)}" + (" (recorded before)" if skipped else f"; {progress.left()}"), flush=True)
    return record


def outcome(record: dict) -> str:
    if record["status"] != "ok":
        last = next((line for line in reversed(record.get("log_tail", [])) if line.strip()), "")
        return f"FAILED (exit code {record['exit_code']}; {record['log']}): {last[:160]}"
    training, evaluation, raw = record["training"], record.get("evaluation") or {}, record.get("raw") or {}
    ev = f"eval {evaluation['mean']:.4g} ± {evaluation['std']:.3g}" if "mean" in evaluation else \
        f"eval failed ({evaluation.get('error', 'not run')})"
    final = training["final_return"]
    text = (f"{ev}, final training return {final:.4g}" if final is not None else f"{ev}, no episode finished") + \
        f", {frames_text(training['frames'])} frames in {seconds_text(record['wall_seconds'])}"
    if raw.get("training_vs_raw"):
        text += f", {raw['training_vs_raw']:.2f} of the raw rate"
    return text


def write_outputs(out: str, records: list[dict], scores: PublishedScores, command: str,
                  args: argparse.Namespace) -> dict:
    """results.json, results.md and plots/ENV.png from the records."""
    settings = {"suite": args.suite, "envs": args.envs, "seeds": parse_seeds(args.seeds), "frames": args.frames,
                "eval_episodes": args.eval_episodes, "raw_rate": args.raw_rate, "extra": args.extra}
    results = build_results(records, scores, run_context(command, settings))
    write_json(os.path.join(out, "results.json"), results)
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown(results, scores))
    for env in results["envs"]:
        runs = [r for r in results["runs"] if r["env"] == env]
        plot_env(env, runs, scores.references(env), os.path.join(out, "plots", f"{env.replace('/', '_')}.png"))
    return results


def _on_sigterm(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    scores = published.load()
    try:
        specs = plan_runs(args, scores)
    except UsageError as exc:
        print(f"reproduce: error: {exc}", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out)
    command = shlex.join(["python", "scripts/reproduce.py", *argv])
    progress, records, status = Progress(specs, out), [], 0
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    print(f"reproduce: {len(specs)} runs, {len(progress.to_train)} to train; outputs in {out}", flush=True)
    try:
        for i, spec in enumerate(specs, 1):
            head = f"[{i}/{len(specs)}] {spec.env} seed {spec.seed}"
            records.append(run_one(spec, out, args, head, progress))
    except (KeyboardInterrupt, Interrupted):
        print("reproduce: interrupted; every trainer process was stopped. Rerun the same command to go on "
              "(the interrupted run starts afresh).", flush=True)
        status = 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if records:
        write_outputs(out, records, scores, command, args)
        print(f"results: {os.path.join(out, 'results.md')}, {os.path.join(out, 'results.json')}, plots in "
              f"{os.path.join(out, 'plots')}")
    return status or (1 if any(r["status"] != "ok" for r in records) else 0)


if __name__ == "__main__":
    sys.exit(main())
