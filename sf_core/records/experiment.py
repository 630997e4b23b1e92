"""The experiment folder `{train_dir}/{experiment}/`: config.json, TensorBoard logs, restart policy."""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import threading
import time
from typing import Callable

from sf_core.config import Config, ConfigError
from sf_core.records.atomic_file import replacing
from sf_core.records.experiment_lock import LOCK_FILE

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
    with replacing(os.path.join(experiment_path, "eval_results.json")) as tmp, open(tmp, "w") as f:
        json.dump(results, f, indent=2)
    if cfg.with_wandb if with_wandb is None else with_wandb:
        from sf_core.records.wandb_logging import log_evaluation  # wandb is an optional extra

        log_evaluation(cfg, experiment_path, results)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


class Experiment:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.path = os.path.join(cfg.train_dir, cfg.experiment)

    def prepare(self, resuming: bool) -> None:
        """Apply --restart_behavior to an existing folder, then write config.json. The run's lock file
        (sf_core/records/experiment_lock.py) stays where it is: the folder stays locked throughout."""
        entries = sorted(set(os.listdir(self.path)) - {LOCK_FILE}) if os.path.isdir(self.path) else []
        if entries and not resuming:
            behavior = self.cfg.restart_behavior
            if behavior == "overwrite":
                for name in entries:
                    _remove(os.path.join(self.path, name))
            elif behavior == "restart":
                aside = f"{self.path}.old_{time.strftime('%Y%m%d_%H%M%S')}"
                os.makedirs(aside)
                for name in entries:
                    os.rename(os.path.join(self.path, name), os.path.join(aside, name))
                log.info("previous experiment files moved to %s", aside)
        os.makedirs(self.path, exist_ok=True)
        self._write_atomically("config.json", self.cfg.to_json())
        log.info("experiment folder: %s", self.path)

    def write_summary(self, summary: dict) -> None:
        """training_summary.json: how the run ended and what it reached (read by tests and benchmarks)."""
        self._write_atomically("training_summary.json", json.dumps(summary, indent=2))

    def _write_atomically(self, name: str, text: str) -> None:
        with replacing(os.path.join(self.path, name)) as tmp, open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

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
    of their first frames that much later (docs/performance.md, "Start-up without the garbage collector").

    A write the writer's thread could not make (a full disk) is raised by the writer's next call, in the
    runner, naming the log folder; the thread itself stays quiet about it (`_quiet_writer_threads`)."""

    def __init__(self, **kwargs) -> None:
        self._kwargs, self._writer = kwargs, None

    def __getattr__(self, name: str):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_writer_threads()
            self._writer = SummaryWriter(**self._kwargs)
        found = getattr(self._writer, name)
        return _naming(found, self._kwargs["log_dir"]) if callable(found) else found


def _naming(method: Callable, log_dir: str) -> Callable:
    """`method`, whose OSErrors name the log folder (the writer's own name no file)."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except OSError as exc:
            if exc.errno is None or exc.filename is not None:
                raise
            raise OSError(exc.errno, exc.strerror, log_dir) from exc

    return call


def _quiet_writer_threads() -> None:
    """A TensorBoard writer thread whose write failed keeps the error for the writer's next call, which raises
    it in the runner: the run stops with one message. The traceback threading.excepthook would also print
    as the thread ends would be a second report of it, at any moment, possibly after the run's last line."""
    previous = threading.excepthook
    if getattr(previous, "quiets_writer_threads", False):
        return

    def hook(args) -> None:
        kept = type(args.thread).__name__ == "_AsyncWriterThread" and getattr(args.thread, "exception", None)
        if kept is not args.exc_value:
            previous(args)

    hook.quiets_writer_threads = True  # type: ignore[attr-defined]
    threading.excepthook = hook
