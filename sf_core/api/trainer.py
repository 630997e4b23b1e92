"""Training from Python: `Trainer(env=..., **flags).train()` runs what `python -m sf_core.train` runs and hands back
a `TrainingResult` instead of an exit code."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sf_core.cli.train import configure, in_starting_worker, setup_logging
from sf_core.config import ConfigError, default
from sf_core.records.experiment_lock import ExperimentLock

if TYPE_CHECKING:
    from sf_core.api.policy import Policy

EXIT_SIGINT, EXIT_SIGTERM = 130, 143


class TrainingError(RuntimeError):
    """Training stopped on an error; `result` is what the run had reached (its summary says how it ended)."""

    def __init__(self, message: str, result: TrainingResult):
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class TrainingResult:
    """What a run reached, read from its experiment folder's training_summary.json (`summary` holds all of it)."""

    experiment_dir: str
    frames: int  # env frames sampled, over every session of the experiment
    seconds: float  # this session's wall clock, from the call to train()
    episodes: int
    mean_return: float | None  # over the last --stats_window episodes when training stopped
    best_mean_return: float | None  # the best such mean at a checkpoint (best.pt, unless evaluations choose it)
    time_to_target: float | None  # training seconds to --target_mean_return (every session's), if reached
    last_checkpoint: str | None
    summary: dict = field(repr=False)

    @classmethod
    def read(cls, experiment_dir: str) -> TrainingResult:
        with open(os.path.join(experiment_dir, "training_summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        return cls(experiment_dir, summary["frames"], summary["seconds"], summary["episodes"], summary["mean_return"],
                   summary.get("best_mean_return"), summary["time_to_target"], summary.get("last_checkpoint"),
                   summary)

    def load_policy(self, checkpoint: str = "best", device: str = "cpu") -> Policy:
        """The trained policy (`best`, `latest` or a checkpoint file), ready to `predict`."""
        from sf_core.api.policy import load_policy

        return load_policy(self.experiment_dir, checkpoint, device=device)


class Trainer:
    """A run of `python -m sf_core.train` from Python. Keywords are its flags (`--help` lists them), with Python
    values: `Trainer(env="CartPole-v1", num_workers=2, encoder_mlp_layers=[64, 64], serial_mode=True)`.
    Presets, the machine's defaults and the checks apply as on the command line. `experiment` defaults to the
    env's name, and `train()` again resumes the experiment (raise `train_for_env_steps` to train further)."""

    def __init__(self, env: str, experiment: str | None = None, **flags: Any):
        self.flags: dict[str, Any] = {"env": env, "experiment": experiment or _folder_name(env), **flags}

    @property
    def experiment_dir(self) -> str:
        return os.path.join(str(self.flags.get("train_dir", default("train_dir"))), str(self.flags["experiment"]))

    def train(self, **flags: Any) -> TrainingResult:
        """Train until a stop condition (`train_for_env_steps`, `train_for_seconds`, `target_mean_return`); `flags`
        are kept for later calls too. Raises ConfigError for flags that cannot work, TrainingError when training
        stopped on an error, and KeyboardInterrupt after Ctrl-C (a checkpoint is saved first)."""
        from sf_core.run.runner import Runner

        self.flags.update(flags)
        launched = time.time()
        setup_logging()
        if (problem := in_starting_worker()) is not None:
            raise RuntimeError(problem)
        lock = ExperimentLock()  # one run per experiment folder, as on the command line
        try:
            cfg = configure(to_argv(self.flags), lock)
            runner = Runner(cfg, launched=launched)
            code = runner.run()
        except SystemExit as exc:  # `help=True`: the usage was printed
            raise ConfigError("the flags were printed (help); nothing was trained") from exc
        finally:
            lock.release()
        result = TrainingResult.read(os.path.join(cfg.train_dir, cfg.experiment))
        if code in (EXIT_SIGINT, EXIT_SIGTERM):
            raise KeyboardInterrupt(f"training interrupted; the last checkpoint: {result.last_checkpoint}")
        if code != 0:
            raise TrainingError((runner.error or f"training stopped with exit code {code}").splitlines()[0], result)
        return result

    def load_policy(self, checkpoint: str = "best", device: str = "cpu") -> Policy:
        from sf_core.api.policy import load_policy

        return load_policy(self.experiment_dir, checkpoint, device=device)


def to_argv(flags: dict[str, Any]) -> list[str]:
    """Keyword flags as the command line spells them: a list is its items, a bool True or False."""
    argv: list[str] = []
    for name, value in flags.items():
        if isinstance(value, (list, tuple)):
            argv += [f"--{name}", *(str(v) for v in value)]
        else:
            argv.append(f"--{name}={value}")
    return argv


def _folder_name(env: str) -> str:
    """An experiment folder's name from an env id (`ALE/Pong-v5` -> `ALE_Pong-v5`)."""
    return re.sub(r"[^\w.-]", "_", env)

