"""--scaling=2,4,8,16: our training phase at each --num_workers (every other flag as given), frames/s and
frames/s per worker, and with --plot=PATH.png a line plot of frames/s against workers.

Each count is resolved as the trainer would resolve it, so the table shows the inference workers and envs
per worker it ran with: where they are fitted to the machine, a typed --num_workers can change them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .report import aligned, ratio
from .sweep import PhaseRunner, resolve


@dataclass
class ScalingPoint:
    workers: int
    resolved: dict[str, int] | str  # the sizing flags the trainer resolves, or why it rejects this count

    @property
    def phase(self) -> str:
        return f"scaling_{self.workers}w"


def plan(workers: list[int], cfg_argv: list[str], extra: list[str]) -> list[ScalingPoint]:
    return [ScalingPoint(n, resolve(cfg_argv, extra, [f"--num_workers={n}"])) for n in sorted(set(workers))]


def run_scaling(bench: PhaseRunner, points: list[ScalingPoint]) -> None:
    """One training phase per worker count, fewest first; results["scaling"] holds every count, even
    after an interruption."""
    try:
        for p in points:
            if isinstance(p.resolved, dict):
                bench.phase(p.phase, lambda: bench.ours(p.phase, bench.extra + [f"--num_workers={p.workers}"],
                                                        sampling_only=False),
                            label=f"sf_core training --num_workers={p.workers}")
    finally:
        bench.results["scaling"] = entries(points, bench.results["phases"])


def entries(points: list[ScalingPoint], phases: dict) -> list[dict]:
    out = []
    for p in points:
        result = phases.get(p.phase) or {}
        rejected = p.resolved if isinstance(p.resolved, str) else None
        status = "skipped" if rejected else result.get("status", "not run")
        fps = result.get("fps") if status == "ok" else None
        entry = {"num_workers": p.workers, "status": status, "fps": fps,
                 "fps_per_worker": round(fps / p.workers, 1) if fps else None,
                 "flags": None if rejected else p.resolved, "peak_rss_mb": result.get("peak_rss_mb"),
                 "phase": p.phase}
        reason = rejected or result.get("error")
        if reason:
            entry["reason"] = reason
        out.append(entry)
    return out


def report_lines(points: list[dict]) -> list[str]:
    """The table, fewest workers first; the speed-up is against the fewest workers that measured."""
    first = next((e for e in points if e["fps"]), None)
    head = ("workers", "inference workers", "envs/worker", "frames/s", "frames/s per worker",
            _speedup_head(first), "peak RSS MB", "notes")
    rows = [(e["num_workers"], (e["flags"] or {}).get("policy_workers_per_policy", ""),
             (e["flags"] or {}).get("num_envs_per_worker", ""),
             f"{e['fps']:,.0f}" if e["fps"] else e["status"],
             f"{e['fps_per_worker']:,.0f}" if e["fps"] else "",
             f"{ratio(e['fps'], first['fps']):.2f}" if e["fps"] and first else "",
             f"{e['peak_rss_mb']:,.0f}" if e.get("peak_rss_mb") is not None else "",
             (e.get("reason") or "")[:60]) for e in points]
    return aligned(head, rows, ">>>>>>><")


def _speedup_head(first: dict | None) -> str:
    if first is None:
        return "speed-up"
    return f"x {first['num_workers']} worker{'s' if first['num_workers'] > 1 else ''}"


def device_name(requested: str) -> str:
    """The device the trainer would use for --device=`requested`, in words, for the plot's title."""
    if requested == "cpu":
        return "CPU"
    import torch  # only for a GPU request: the plain CPU case needs no torch start-up

    from sf_core.machine.device import resolve_device  # the trainer's own resolution: gpu means cuda, no CUDA the CPU

    device = resolve_device(requested)
    return "CPU" if device == "cpu" else f"GPU {torch.cuda.get_device_name(device)}"


def plot_title(env: str, cores: int, device: str) -> str:
    return f"{env}: training frames/s against rollout workers\n{cores} usable cores, {device}"


def write_plot(points: list[dict], path: str, title: str) -> bool:
    """A PNG line plot of frames/s against workers, with linear scaling from the fewest workers dashed
    beside it; False (and no file) when no count measured frames/s."""
    measured = [e for e in points if e["fps"]]
    if not measured:
        return False
    import matplotlib

    matplotlib.use("Agg")  # no display: the benchmark runs on headless machines
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    workers, fps = [e["num_workers"] for e in measured], [e["fps"] for e in measured]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        ax.plot(workers, fps, marker="o", label="measured")
        ax.plot(workers, [fps[0] * n / workers[0] for n in workers], linestyle="--", color="grey",
                label=f"linear from {workers[0]} worker{'s' if workers[0] > 1 else ''}")
        ax.set_xticks(workers, [str(n) for n in workers])  # a linear axis: linear scaling stays a straight line
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:,.0f}"))
        ax.set_xlim(left=0)
        ax.set_xlabel("rollout workers (--num_workers)")
        ax.set_ylabel("env frames/s")
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
    return True
