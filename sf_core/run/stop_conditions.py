"""When a run is done: the stop conditions it checks while it trains, and before a resumed run starts.

Each limit counts over all the sessions of an experiment: env frames and training seconds continue from
the checkpoint a run resumes from (sf_core/run/stats.py), so a finished experiment run again with the
same flags has nothing left to do, and stops before it starts a process.
"""

from __future__ import annotations

from sf_core.config import Config
from sf_core.run.population import Population
from sf_core.run.stats import TrainingStats

TARGET = "target_mean_return"


def limits_reached(cfg: Config, stats: TrainingStats, training_seconds: float) -> list[str]:
    """The stop flags that `stats` meet, target first, then frames, then seconds."""
    reached = []
    if stats.target_reached(cfg.target_mean_return):
        reached.append(TARGET)
    if stats.frames >= cfg.train_for_env_steps:
        reached.append("train_for_env_steps")
    if training_seconds >= cfg.train_for_seconds:
        reached.append("train_for_seconds")
    return reached


def reached_line(cfg: Config, flag: str) -> str:
    """The console's line for the stop condition `flag`."""
    every = " (every policy)" if flag == TARGET and cfg.num_policies > 1 else ""
    return f"reached {_named(cfg, flag)}{every}"


def already_finished(cfg: Config, population: Population, experiment_path: str) -> str | None:
    """The console's line for an experiment whose checkpoint already met a stop condition (None when it did
    not, or there is none): what it reached, and how to train it further."""
    if population.resumed is None:
        return None
    stats = TrainingStats(cfg.stats_window, num_policies=cfg.num_policies)
    population.restore(stats)
    reached = limits_reached(cfg, stats, stats.previous_seconds)
    if not reached:
        return None
    flags = " and ".join(_named(cfg, flag) for flag in reached)
    raise_ = " and ".join(f"--{flag}" for flag in reached)
    return (f"{experiment_path} already finished: it reached {flags} ({stats.frames:,} env frames, "
            f"{stats.previous_seconds:.0f} s of training). Nothing to do: to train it further, raise {raise_}; "
            f"to start it afresh, --restart_behavior=restart (its files kept aside) or overwrite")


def _named(cfg: Config, flag: str) -> str:
    value = getattr(cfg, flag)
    return f"--{flag}={value if isinstance(value, int) else format(value, 'g')}"
