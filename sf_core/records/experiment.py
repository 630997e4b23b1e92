"""The experiment folder `{train_dir}/{experiment}/`: config.json, TensorBoard logs, restart policy."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

from sf_core.config import Config, ConfigError

log = logging.getLogger("sf_core")


def load_config(path: str) -> Config:
    """The config an experiment folder was trained with (flags this version no longer has are dropped)."""
    config_file = os.path.join(path, "config.json")
    if not os.path.exists(config_file):
        raise ConfigError(f"no experiment at {path} (config.json not found)")
    with open(config_file) as f:
        return Config.from_dict(json.load(f))


def write_eval_results(experiment_path: str, results: dict, cfg: Config, with_wandb: bool | None) -> None:
    """eval_results.json in the experiment folder, written atomically; also to the run's W&B run when asked
    (`with_wandb` None: if the experiment trained with W&B)."""
    tmp = os.path.join(experiment_path, "eval_results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2)
    os.replace(tmp, os.path.join(experiment_path, "eval_results.json"))
    if cfg.with_wandb if with_wandb is None else with_wandb:
        from sf_core.records.wandb_logging import log_evaluation  # wandb is an optional extra

        log_evaluation(cfg, experiment_path, results)


class Experiment:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.path = os.path.join(cfg.train_dir, cfg.experiment)

    def prepare(self, resuming: bool) -> None:
        """Apply --restart_behavior to an existing folder, then write config.json."""
        if os.path.isdir(self.path) and os.listdir(self.path) and not resuming:
            behavior = self.cfg.restart_behavior
            if behavior == "overwrite":
                shutil.rmtree(self.path)
            elif behavior == "restart":
                aside = f"{self.path}.old_{time.strftime('%Y%m%d_%H%M%S')}"
                os.rename(self.path, aside)
                log.info("previous experiment files moved to %s", aside)
        os.makedirs(self.path, exist_ok=True)
        self._write_atomically("config.json", self.cfg.to_json())
        log.info("experiment folder: %s", self.path)

    def write_summary(self, summary: dict) -> None:
        """training_summary.json: how the run ended and what it reached (read by tests and benchmarks)."""
        self._write_atomically("training_summary.json", json.dumps(summary, indent=2))

    def _write_atomically(self, name: str, text: str) -> None:
        tmp = os.path.join(self.path, f"{name}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.path, name))

    def summary_writer(self, start_frames: int = 0):
        """TensorBoard writer; on resume, events logged after the checkpoint (lost work) are purged
        so the curves continue from where the checkpoint left them. With --with_wandb=True, a writer that
        also logs to W&B (sf_core/records/wandb_logging.py). Made after the component processes started:
        TensorBoard's writer runs a thread and wandb a service process, which a fork must not copy."""
        writer = DeferredSummaryWriter(log_dir=os.path.join(self.path, "tb"), flush_secs=10,
                                       purge_step=start_frames if start_frames > 0 else None)
        if self.cfg.with_wandb:
            from sf_core.records import wandb_logging

            return wandb_logging.WandbWriter(writer, wandb_logging.init_run(self.cfg, self.path))
        return writer


class DeferredSummaryWriter:
    """torch's SummaryWriter, made at its first use: a runner that imports it while its components start hears
    of their first frames that much later (docs/performance.md, "Start-up without the garbage collector")."""

    def __init__(self, **kwargs) -> None:
        self._kwargs, self._writer = kwargs, None

    def __getattr__(self, name: str):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(**self._kwargs)
        return getattr(self._writer, name)
