"""scripts/reproduce.py's plots: per env, every seed's learning curve against env frames and against wall-clock
seconds since launch, with the published scores as horizontal lines labelled with their source."""

from __future__ import annotations

import os

from .published import Reference


def plot_env(env: str, runs: list[dict], references: list[Reference], path: str) -> str | None:
    """Write `path` (a PNG); None, and no file, when no run of `env` has a curve."""
    curves = [(r["seed"], r["curve"]) for r in runs if (r.get("curve") or {}).get("frames")]
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_frames, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    try:
        for seed, curve in curves:
            by_frames.plot(curve["frames"], curve["returns"], label=f"seed {seed}")
            by_time.plot(curve["seconds"], curve["returns"], label=f"seed {seed}")
        for i, ref in enumerate(references):
            label = f"{ref.label} ({ref.their_env}): {ref.score_text()}"
            for ax in (by_frames, by_time):
                ax.axhline(ref.mean, color=f"C{len(curves) + i}", linestyle="--", linewidth=1, label=label)
        by_frames.set_xlabel("env frames")
        by_time.set_xlabel("wall-clock seconds since launch")
        by_time.set_xlim(left=0)  # start-up shows: the user waits for it too
        for ax in (by_frames, by_time):
            ax.set_ylabel("mean training return (last 100 episodes)")
            ax.grid(alpha=0.3)
        by_frames.legend(fontsize=8)
        fig.suptitle(env)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
