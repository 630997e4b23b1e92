"""Weights & Biases beside TensorBoard (`--with_wandb=True`, the `wandb` extra).

The run logs directly, not through wandb's TensorBoard patching: `WandbWriter` stands in for the
TensorBoard writer, passes every scalar on to it and logs the same scalars to W&B once per summary,
against `env_frames` (TensorBoard's step). The run id is kept in config.json (`--wandb_unique_id`),
so a resumed training and `python -m sf_core.enjoy` (its video and results) log to the same run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid
from typing import Any

from sf_core.config import Config, ConfigError

log = logging.getLogger("sf_core")

STEP = "env_frames"


def with_run_id(cfg: Config, experiment_path: str) -> Config:
    """cfg with `wandb_unique_id` set: as given, else the one in the experiment's config.json when the run
    resumes there, else a new one."""
    import importlib.util

    if importlib.util.find_spec("wandb") is None:  # now, not after the component processes started
        raise ConfigError("--with_wandb=True needs wandb: pip install -e '.[wandb]'")
    if cfg.wandb_unique_id:
        return cfg
    previous = os.path.join(experiment_path, "config.json")
    if cfg.restart_behavior == "resume" and os.path.exists(previous):
        with open(previous) as f:
            run_id = json.load(f).get("wandb_unique_id", "")
        if run_id:
            return dataclasses.replace(cfg, wandb_unique_id=run_id)
    return dataclasses.replace(cfg, wandb_unique_id=f"{cfg.experiment}_{uuid.uuid4().hex[:8]}")


def init_run(cfg: Config, experiment_path: str, job_type: str | None = None) -> Any:
    """Start (or resume) the experiment's W&B run; its files go under `{experiment_path}/wandb/`."""
    try:
        import wandb
    except ImportError:
        raise ConfigError("--with_wandb=True needs wandb: pip install -e '.[wandb]'") from None
    os.makedirs(experiment_path, exist_ok=True)
    run = wandb.init(project=cfg.wandb_project, entity=cfg.wandb_user or None, group=cfg.wandb_group or None,
                     job_type=job_type or cfg.wandb_job_type, tags=list(cfg.wandb_tags) or None,
                     id=cfg.wandb_unique_id or None, name=cfg.experiment, resume="allow", dir=experiment_path,
                     config=dataclasses.asdict(cfg))
    run.define_metric(STEP)
    run.define_metric("*", step_metric=STEP)
    log.info("W&B run %s (project %s)", run.id, cfg.wandb_project)
    return run


class WandbWriter:
    """A TensorBoard writer that also logs its scalars to a W&B run (one log call per flush)."""

    def __init__(self, tensorboard: Any, run: Any):
        self.tensorboard, self.run = tensorboard, run
        self.pending: dict[str, float] = {}
        self.step = 0

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.tensorboard.add_scalar(tag, value, step)
        if step != self.step and self.pending:
            self._log()
        self.step = step
        self.pending[tag] = float(value)

    def _log(self) -> None:
        self.run.log({**self.pending, STEP: self.step})
        self.pending = {}

    def flush(self) -> None:
        self.tensorboard.flush()
        if self.pending:
            self._log()

    def close(self) -> None:
        self.flush()
        self.tensorboard.close()
        self.run.finish()


def log_evaluation(cfg: Config, experiment_path: str, results: dict) -> None:
    """enjoy's results, and its video if it made one, into the experiment's W&B run."""
    import wandb

    run = init_run(cfg, experiment_path, job_type="enjoy")
    summary = {f"eval/{key}": results[key] for key in ("mean_return", "std_return", "mean_length", "episodes")}
    if results.get("video"):
        summary["eval/replay"] = wandb.Video(results["video"], format="mp4")
    run.log({**summary, STEP: results.get("env_frames", 0)})  # beside the training curves' last point
    run.summary.update({k: v for k, v in summary.items() if k != "eval/replay"})
    run.finish()
