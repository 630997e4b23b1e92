"""What a run records: the statistics it starts with (a resumed run's counters, the TensorBoard and W&B
writer) and what it leaves when it ends (training_summary.json's final content, the console's closing lines)."""

from __future__ import annotations

from sf_core.config import Config
from sf_core.records.experiment import Experiment
from sf_core.run.population import Population
from sf_core.run.stats import TrainingStats


def start_stats(cfg: Config, experiment: Experiment, population: Population, launched: float,
                marks: dict[str, float]) -> TrainingStats:
    """The run's statistics, a resumed run's counters restored. Made after the processes start: the
    TensorBoard writer runs a thread, which a fork must not copy; wandb runs a service process."""
    start_frames = population.resumed["frames"] if population.resumed else 0
    stats = TrainingStats.for_run(cfg, experiment.summary_writer(start_frames), launched, marks)
    population.restore(stats)
    return stats


def final_summary(stats: TrainingStats, last: list[str | None], exit_code: int | None, error: str | None) -> dict:
    """The summary of a run that ended (`last`: each policy's latest checkpoint, None where it has none)."""
    summary = stats.summary(exit_code, error)
    summary["last_checkpoint"] = last[stats.best_policy()]
    if len(last) > 1:
        summary["last_checkpoints"] = last
    return summary


def closing_lines(stats: TrainingStats, last: list[str | None], time_report: bool) -> list[str]:
    """Each policy's result, where the time went (--time_report) and the checkpoints to load."""
    lines = stats.policy_report() + (stats.accounting.lines() if time_report else [])
    best = last[stats.best_policy()]
    if len(last) == 1 and best:
        lines.append(f"last checkpoint: {best}")
    for policy, path in enumerate(last if len(last) > 1 else []):
        lines.append(f"last checkpoint of policy {policy}{' (the best)' if path == best else ''}: "
                     f"{path or 'none yet'}")
    return lines


def error_lines(error: str | None) -> list[str]:
    """How the console ends a run that failed: the traceback, then the line that says why it stopped, last."""
    headline, _, details = (error or "").partition("\n")
    return [text for text in (details, headline) if text]
