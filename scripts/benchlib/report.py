"""What a benchmark run reports: the machine, its settings, ratios between phases, a table, the JSON file."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

import psutil

from sf_core.machine.fit import usable_cores  # the cores this process may run on: the trainer's own count
from .ours import REPORT_INTERVAL_SEC, SUMMARY_INTERVAL_SEC
from .proctree import MB, MEMORY_SAMPLE_SEC

if TYPE_CHECKING:
    from sf_core.config import Config

LABELS = {"raw_env_1proc": "raw env, 1 process", "raw_env_per_core": "raw env, 1 process per core",
          "sampling": "sf_core sampling only", "training": "sf_core training", "sample_factory": "Sample Factory",
          "first_frame": "sf_core first frame after launch"}
CONFIG_KEYS = ("env", "num_workers", "num_envs_per_worker", "worker_num_splits", "policy_workers_per_policy",
               "rollout", "batch_size", "num_batches_per_epoch", "num_epochs", "encoder_mlp_layers", "async_rl",
               "serial_mode", "device", "env_frameskip", "torch_threads", "mp_start_method")
NOTES = [
    "frames/s: env frames per second inside the timed window; raw phases count env.step calls "
    "(resets after episode ends are included in the time, not counted as frames)",
    "trainers: the timed window runs from the first progress report at least --warmup s after the first "
    "one with frames > 0 to the first report --seconds later; ours reports in training_summary.json "
    "(rewritten every summary_interval s, on the trainer's own clock), SF in its status lines (its log "
    "timestamps); the run is then stopped with SIGINT (exit code 130 for ours, 2 for SF, is expected)",
    "time_to_first_frame_s: from the launch of the process (interpreter start-up and imports "
    "included); time_to_first_frame_trainer_s is the trainer's own figure, from its Runner's start",
    "peak RSS sums every process of the tree: shared pages (torch libraries, shared-memory buffers) "
    "count once per process; peak PSS counts them once",
    "Sample Factory: frames/s is its own FPS metric (env frames counted by its learner), read from "
    "its 5-second status lines, so its window edges are coarser",
]


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


def new_results(args: argparse.Namespace, cfg: Config, cfg_argv: list[str], extra: list[str],
                phases_wanted: list[str], raw_processes: int, raw_warmup: float) -> dict:
    """The results document before any phase has run (written as it is if the run is interrupted)."""
    resolved = asdict(cfg)
    return {
        "benchmark": "sf_core throughput", "format_version": 1,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "finished": False,
        "machine": machine_info(),
        "settings": {"env": args.env, "seconds": args.seconds, "warmup": args.warmup,
                     "raw_warmup": raw_warmup, "raw_processes": raw_processes,
                     "report_interval": REPORT_INTERVAL_SEC, "summary_interval": SUMMARY_INTERVAL_SEC,
                     "memory_sample_interval": MEMORY_SAMPLE_SEC,
                     "trainer_flags": cfg_argv, "extra": extra, "sf_extra": args.sf_extra_flags,
                     "phases": phases_wanted,
                     "config": {k: resolved[k] for k in CONFIG_KEYS if k in resolved}},
        "phases": {}, "ratios": {}, "commands": [],
        "notes": list(NOTES),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b to 4 decimals; None where either is missing (or b is 0)."""
    return round(a / b, 4) if a is not None and b else None


def compute_ratios(phases: dict) -> dict:
    """Every comparison the results carry, from the phases that succeeded (None for the others)."""
    fps = {name: (p.get("fps") if p.get("status") == "ok" else None) for name, p in phases.items()}
    raw1, ceiling = fps.get("raw_env_1proc"), fps.get("raw_env_per_core")
    sf = phases.get("sample_factory", {})
    sf_fps = sf.get("fps") if sf.get("status") == "ok" else None
    sf_trained = sf.get("samples_trained_per_s") if sf.get("status") == "ok" else None
    train = phases.get("training", {})
    train_trained = train.get("samples_trained_per_s") if train.get("status") == "ok" else None
    return {
        "sampling_vs_raw_1proc": ratio(fps.get("sampling"), raw1),
        "sampling_vs_ceiling": ratio(fps.get("sampling"), ceiling),
        "training_vs_raw_1proc": ratio(fps.get("training"), raw1),
        "training_vs_ceiling": ratio(fps.get("training"), ceiling),
        "training_vs_sampling": ratio(fps.get("training"), fps.get("sampling")),
        "raw_per_core_scaling": ratio(ceiling, raw1),
        "training_vs_sf": ratio(fps.get("training"), sf_fps),
        "training_samples_trained_vs_sf": ratio(train_trained, sf_trained),
        "sampling_vs_sf": ratio(fps.get("sampling"), sf_fps),
        "sf_vs_ceiling": ratio(sf_fps, ceiling),
        "training_vs_baseline": ratio(fps.get("training"), fps.get("training_baseline")),
        "cluster_vs_training": ratio(fps.get("cluster_1_sampler"), fps.get("training")),
        "slow_2_nodes_vs_1_node": ratio(fps.get("slow_2_nodes"), fps.get("slow_1_node")),
        **{f"{name}_vs_sf": ratio(fps.get(name), sf_fps) for name in phases if name.startswith("training_variant")},
        **{f"{name}_vs_{name.split('_')[0]}": ratio(fps.get(name), fps.get(name.split("_")[0]))
           for name in phases if "_variant_" in name},
    }


def median_round(runs: list[dict]) -> dict:
    """A phase's result over its rounds: the round with the median frames/s (the lower one of an even
    count), with every round's figure beside it; the last round if none measured frames/s."""
    measured = sorted((r for r in runs if r.get("fps") is not None), key=lambda r: r["fps"])
    chosen = dict(measured[(len(measured) - 1) // 2] if measured else runs[-1])
    chosen["fps_rounds"] = [r.get("fps") for r in runs]
    return chosen


def table(results: dict) -> str:
    """The phases as an aligned text table, in the order they ran."""
    phases = results["phases"]
    raw1 = phases.get("raw_env_1proc", {}).get("fps")
    ceiling = phases.get("raw_env_per_core", {}).get("fps")
    head = ("phase", "frames/s", "x raw 1p", "x ceiling", "peak RSS MB", "notes")
    rows = [_row(name, p, raw1, ceiling) for name, p in phases.items()]
    return "\n".join(aligned(head, rows, "<>>>><"))


def aligned(head: tuple, rows: list[tuple], align: str) -> list[str]:
    """A text table's lines: a header, a rule, the rows; `align` holds one '<' or '>' per column."""
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(f"{str(c):{a}{w}}" for c, a, w in zip(r, align, widths)).rstrip()  # noqa: E731
    return [fmt(head), fmt(tuple("-" * w for w in widths)), *[fmt(r) for r in rows]]


def int_list(text: str, option: str) -> list[int]:
    """A comma list of positive integers (--scaling=2,4,8), duplicates dropped, in the order given."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SystemExit(f"benchmark: --{option} takes positive integers separated by commas, got {text!r}")
    return list(dict.fromkeys(values))


def _row(name: str, p: dict, raw1: float | None, ceiling: float | None) -> tuple:
    label = p.get("label") or LABELS.get(name, name)
    if name == "raw_env_per_core" and p.get("processes"):
        label = f"raw env, {p['processes']} processes"
    if name == "sample_factory" and p.get("version"):
        label = f"Sample Factory {p['version']}"
    if p.get("status") != "ok":
        return (label, p.get("status", "?"), "", "", "", (p.get("reason") or p.get("error") or "")[:60])
    if p.get("fps") is None:  # a phase of another figure (first_frame): its line says it
        return (label, "", "", "", "", p.get("line", ""))
    fps = p["fps"]
    return (label, f"{fps:,.0f}", _fmt_ratio(fps, raw1), _fmt_ratio(fps, ceiling),
            f"{p['peak_rss_mb']:,.0f}" if p.get("peak_rss_mb") is not None else "", "; ".join(_notes(name, p)))


def _notes(name: str, p: dict) -> list[str]:
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
    if len(p.get("fps_rounds") or ()) > 1:
        notes.append("median of " + ", ".join(f"{f:,.0f}" if f is not None else "-" for f in p["fps_rounds"]))
    return notes


def _fmt_ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else ""


def finish(results: dict) -> None:
    """Fill in what is known only at the end: ratios, end time and load, the table."""
    results["ratios"] = compute_ratios(results["phases"])
    results["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    results["table"] = table(results).splitlines()


def write_json(path: str, results: dict) -> None:
    """Write `results` to `path` atomically (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2, default=str)
    os.replace(tmp, path)
