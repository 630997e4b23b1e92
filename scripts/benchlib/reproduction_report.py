"""What scripts/reproduce.py reports from its runs' records: per env the figures over seeds beside the published
ones (results.json), and a markdown table per suite to paste into docs/results.md (results.md)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time

import numpy as np

from . import REPO
from .published import PublishedScores, Reference, first_reaching
from .report import machine_info

VERSUS = {"eval": "vs. our evaluation", "final_return": "vs. our training return"}


def to_references(record: dict, references: list[Reference]) -> list[dict]:
    """Where the run's curve first reaches each reference: wall-clock seconds since launch and frames (None
    where it never does)."""
    curve = record.get("curve") or {}
    found = []
    for ref in references:
        hit = first_reaching(curve.get("frames", []), curve.get("seconds", []), curve.get("returns", []), ref.mean)
        found.append({"source": ref.source, "score": ref.mean, "seconds": hit[0] if hit else None,
                      "frames": hit[1] if hit else None})
    return found


def env_summary(records: list[dict], references: list[Reference]) -> dict:
    """One env over its seeds: mean ± std (over seeds) of the evaluation and of the final training return,
    medians of the rest, and each reference beside the figure of ours it is compared with."""
    ok = [r for r in records if r["status"] == "ok"]
    evals = [r["evaluation"]["mean"] for r in ok if "mean" in (r.get("evaluation") or {})]
    finals = [r["training"]["final_return"] for r in ok if r["training"].get("final_return") is not None]
    ratios = [r["raw"]["training_vs_raw"] for r in ok if (r.get("raw") or {}).get("training_vs_raw")]
    ours = {"eval": _mean_std(evals), "final_return": _mean_std(finals)}
    return {
        "seeds": [r["seed"] for r in records], "ok": len(ok), "failed": len(records) - len(ok),
        "eval": ours["eval"], "final_return": ours["final_return"],
        "frames": _median([r["training"]["frames"] for r in ok]),
        "median_wall_seconds": _median([r["wall_seconds"] for r in ok]),
        "fps": _median([r["training"]["fps"] for r in ok if r["training"].get("fps")]),
        "raw_fps": _median([r["raw"]["fps"] for r in ok if (r.get("raw") or {}).get("fps")]),
        "training_vs_raw": _median(ratios),
        "references": [_beside(ref, ours[ref.ours], ok) for ref in references],
    }


def _beside(ref: Reference, ours: dict | None, ok: list[dict]) -> dict:
    reached = [next(t for t in r["to_reference"] if t["source"] == ref.source) for r in ok]
    # a seed that never reached it counts as the slowest, so it can only raise the median (None: most never did)
    seconds = statistics.median([t["seconds"] if t["seconds"] is not None else float("inf") for t in reached]) \
        if reached else float("inf")
    frames = statistics.median([t["frames"] if t["frames"] is not None else float("inf") for t in reached]) \
        if reached else float("inf")
    return {**ref.as_dict(), "compared_with": ref.ours, "ours": ours["mean"] if ours else None,
            "at_least": (ours["mean"] >= ref.mean) if ours else None,
            "seeds_reaching": sum(t["seconds"] is not None for t in reached),
            "median_seconds_to_reach": None if seconds == float("inf") else seconds,
            "median_frames_to_reach": None if frames == float("inf") else frames}


def _mean_std(values: list[float]) -> dict | None:
    return {"mean": round(float(np.mean(values)), 4), "std": round(float(np.std(values)), 4), "n": len(values)} \
        if values else None


def _median(values: list[float]) -> float | None:
    return round(float(statistics.median(values)), 4) if values else None


def build_results(records: list[dict], scores: PublishedScores, context: dict) -> dict:
    """results.json: the context (command, date, machine, commit, settings), every run with where it reached
    each reference, and per env the summary over seeds, envs in the order they ran."""
    runs = [{**r, "to_reference": to_references(r, scores.references(r["env"]))} for r in records]
    envs: dict[str, dict] = {}
    for env in dict.fromkeys(r["env"] for r in runs):
        mine = [r for r in runs if r["env"] == env]
        envs[env] = {"suite": mine[0]["suite"], **env_summary(mine, scores.references(env))}
    return {"format_version": 1, **context, "references_file": os.path.relpath(scores.path, REPO), "envs": envs,
            "runs": runs}


def run_context(command: str, settings: dict) -> dict:
    """The command, date, machine (CPU model, cores, GPU), commit and settings a results file names."""
    return {"command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "machine": {**machine_info(), "gpu": gpu_names()}, "commit": commit(), "settings": settings}


def gpu_names() -> list[str]:
    """The GPUs nvidia-smi lists (none where it is not installed)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def commit() -> str:
    """HEAD of the checkout the runs used, marked when its tree had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=20).stdout.strip()
    try:
        head = git("rev-parse", "--short=12", "HEAD") or "unknown"
        return head + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def markdown(results: dict, scores: PublishedScores) -> str:
    """results.md: per suite a table of its envs, the sources of its references, then the run's context."""
    parts = []
    for suite in dict.fromkeys(e["suite"] for e in results["envs"].values()):
        envs = {name: e for name, e in results["envs"].items() if e["suite"] == suite}
        parts.append(suite_table(suite, envs))
        parts.append(sources_list(envs, scores))
    machine = results["machine"]
    gpu = ", ".join(machine["gpu"]) or "none"
    parts.append("\n".join([
        f"Command: `{results['command']}`", "",
        f"Date: {results['date']}; commit {results['commit']}", "",
        f"Machine: {machine['cpu_model'] or 'unknown CPU'}, {machine['usable_cores']} usable cores "
        f"({machine['cpu_count']} logical); GPU: {gpu}; load average at start "
        f"{', '.join(f'{x:.1f}' for x in machine['load_average_at_start'])}", "",
        "Ours: mean ± std over seeds. The evaluation plays the final checkpoint with the most likely actions "
        f"({results['settings']['eval_episodes']} episodes a seed); the final training return is the mean of "
        "the last 100 training episodes. A reference is compared with the figure of ours of its kind "
        "(≥: ours is at least the published mean). Time to a reference: median over seeds of the wall clock "
        "from the launch of the trainer to the first TensorBoard summary whose 100-episode training mean "
        "reaches it (k/n seeds did); summaries come every --experiment_summaries_interval seconds."]))
    return "\n\n".join(parts) + "\n"


def suite_table(suite: str, envs: dict[str, dict]) -> str:
    sources = list(dict.fromkeys(ref["source"] for e in envs.values() for ref in e["references"]))
    labels = {ref["source"]: ref["label"] for e in envs.values() for ref in e["references"]}
    versus = {ref["source"]: VERSUS[ref["compared_with"]] for e in envs.values() for ref in e["references"]}
    head = ["env", "ours: evaluation", "ours: final training return", *[f"{labels[s]} ({versus[s]})" for s in sources],
            "frames", "launch to exit (median)", *[f"time to {labels[s]}" for s in sources], "frames/s"]
    rows = [_row(env, e, sources) for env, e in envs.items()]
    lines = [f"### {suite}", "", "| " + " | ".join(head) + " |",
             "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _row(env: str, e: dict, sources: list[str]) -> list[str]:
    by_source = {ref["source"]: ref for ref in e["references"]}
    n = e["ok"] + e["failed"]
    failed = f" ({e['failed']} of {n} failed)" if e["failed"] else ""
    scores, times = [], []
    for source in sources:
        ref = by_source.get(source)
        if ref is None:
            scores.append("")
            times.append("")
            continue
        mark = "" if ref["at_least"] is None else ("≥ " if ref["at_least"] else "< ")
        scores.append(mark + _score(ref["mean"], ref["std"]))
        reach = ref["median_seconds_to_reach"]
        reached = seconds_text(reach) if reach is not None else "not reached"
        times.append(f"{reached} ({ref['seeds_reaching']}/{e['ok']})" if e["ok"] else "—")
    fps = _number(e["fps"]) if e["fps"] else ""
    if e["training_vs_raw"]:
        fps += f" ({e['training_vs_raw']:.2f} of raw {_number(e['raw_fps'])})"
    return [env + failed, _ours(e["eval"]), _ours(e["final_return"]), *scores,
            frames_text(e["frames"]) if e["frames"] else "", seconds_text(e["median_wall_seconds"]), *times, fps]


def sources_list(envs: dict[str, dict], scores: PublishedScores) -> str:
    seen, lines = set(), []
    for e in envs.values():
        for ref in e["references"]:
            if ref["source"] in seen:
                continue
            seen.add(ref["source"])
            budget = f"{frames_text(ref['budget_frames'])} frames" if ref["budget_frames"] else "no budget"
            seeds = f", {ref['seeds']} seed{'s' if ref['seeds'] != 1 else ''}" if ref["seeds"] else ""
            lines.append(f"- {ref['label']}: {ref['metric'].replace('_', ' ')}, {budget}{seeds}; "
                         f"{ref['env_note']}. {ref['citation']} ({ref['url']})")
    return "\n".join(lines)


def _ours(figure: dict | None) -> str:
    return _score(figure["mean"], figure["std"]) if figure else "—"


def _score(mean: float, std: float | None) -> str:
    """Mean and std with the decimals the mean's size calls for (std as many as the mean)."""
    return _number(mean) + (f" ± {_number(std, like=mean)}" if std is not None else "")


def _number(x: float, like: float | None = None) -> str:
    size = abs(x if like is None else like)
    return f"{x:,.0f}" if size >= 100 else f"{x:.1f}" if size >= 10 else f"{x:.2f}"


def frames_text(n: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def seconds_text(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s:.1f} s" if s < 100 else f"{s:.0f} s" if s < 6000 else f"{s / 3600:.1f} h"
