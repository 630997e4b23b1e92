"""`python -m sf_core.train --env=CartPole-v1 ...`, or `sf_core.train.main(argv)` from a script."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time
from typing import Sequence

from sf_core.envs.env_check import EnvContractError
from sf_core.envs.registry import EnvNotFoundError, UnregisteredEnvError, registry_snapshot
from sf_core.envs.vector_backends import vector_backend
from sf_core.cli import exit_process, unregistered_env_hint
from sf_core.cli.arguments import build_parser, parse_args
from sf_core.common import logs
from sf_core.common.logs import quiet_signal_slot_logs
from sf_core.config import Config, ConfigError
from sf_core.machine.fit import describe, this_machine
from sf_core.machine.heap import collector_paused
from sf_core.machine.start_method import start_forkserver_early
from sf_core.records.experiment_lock import ExperimentLock

log = logging.getLogger("sf_core")


def setup_logging() -> None:
    logs.setup_logging()
    quiet_signal_slot_logs()


def main(argv: Sequence[str] | None = None) -> int:
    """Train; returns the exit code (0 done, 1 error, 2 bad flags, an env that broke its contract or a folder in use,
    130/143 interrupted)."""
    launched = time.time()
    setup_logging()
    if (problem := in_starting_worker()) is not None:
        print(f"sf_core.train: error: {problem}", file=sys.stderr)
        return 2
    lock = ExperimentLock()  # held from the parsed flags to the end: one run per experiment folder
    try:
        return _train(list(sys.argv[1:] if argv is None else argv), lock, launched)
    finally:
        lock.release()


def _train(argv: list[str], lock: ExperimentLock, launched: float) -> int:
    try:
        cfg = configure(argv, lock)
    except ConfigError as exc:
        print(f"sf_core.train: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)

    from sf_core.run.runner import Runner

    try:  # `configured`: flags checked, torch and the runner's modules imported
        return Runner(cfg, launched=launched, marks={"configured": time.time()}).run()
    except EnvContractError as exc:  # found before anything started, like a bad flag
        print(f"sf_core.train: error: {exc}", file=sys.stderr)
        return 2
    except (EnvNotFoundError, ConfigError) as exc:
        unknown = isinstance(exc.__cause__ or exc, UnregisteredEnvError)  # the runner's ConfigError wraps it
        print(f"sf_core.train: error: {exc}{unregistered_env_hint(cfg.env_module, False) if unknown else ''}",
              file=sys.stderr)
        return 1


def in_starting_worker() -> str | None:
    """Why training cannot start here, when this is a worker process still importing the user's script."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # how multiprocessing itself tells
        return ("training was started inside a worker process that is starting up; put the training call of "
                "your script under `if __name__ == \"__main__\":` (worker processes import your script)")
    return None


def configure(argv: Sequence[str], lock: ExperimentLock) -> Config:
    """The run's config from its command line: presets applied and the machine fitted (the console says which),
    then checked; `lock` taken on its experiment folder once the flags are read, before any process starts.
    ConfigError for flags that cannot work or a folder in use; SystemExit after --help."""
    def parsed(flags: dict) -> None:  # the lock before the forkserver: a second run starts no process
        lock.acquire(os.path.join(flags["train_dir"], flags["experiment"]))
        start_forkserver_early(flags)

    parser = build_parser(description="Train an agent with asynchronous PPO (APPO).")
    with collector_paused():  # torch's import, from the flag checks on (sf_core/machine/heap.py)
        # the forkserver's imports overlap ours; the preset's or env fit's lines once the flags are valid
        cfg, _ = parse_args(argv, parser, parsed=parsed, announce=lambda line: log.info("%s", line))
        vector_backend(cfg, registry_snapshot(only=cfg.env))  # a backend that cannot serve the env is a bad flag
        if cfg.machine_fit:
            where = "this machine" if not cfg.ray_address else "this machine; each cluster sampler refits its node"
            log.info("%s", describe(cfg, this_machine(cfg.device), where))
        import sf_core.run.runner  # noqa: F401  (the runner's imports, while the collector is paused)
    return cfg


if __name__ == "__main__":
    exit_process(main())
