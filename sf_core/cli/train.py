"""`python -m sf_core.train --env=CartPole-v1 ...`, or `sf_core.train.main(argv)` from a script."""

from __future__ import annotations

import logging
import multiprocessing
import sys
import time
from typing import Sequence

from sf_core.envs.registry import EnvNotFoundError, UnregisteredEnvError
from sf_core.cli import exit_process, unregistered_env_hint
from sf_core.cli.arguments import build_parser, parse_args
from sf_core.common import logs
from sf_core.common.logs import quiet_signal_slot_logs
from sf_core.config import ConfigError
from sf_core.machine.fit import describe, this_machine
from sf_core.machine.heap import collector_paused
from sf_core.machine.start_method import start_forkserver_early

log = logging.getLogger("sf_core")


def setup_logging() -> None:
    logs.setup_logging()
    quiet_signal_slot_logs()


def main(argv: Sequence[str] | None = None) -> int:
    """Train; returns the exit code (0 done, 1 error, 2 bad flags, 130/143 interrupted)."""
    launched = time.time()
    setup_logging()
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # how multiprocessing itself tells
        print("sf_core.train: error: main() was called inside a worker process that is starting up; put the "
              "training call of your script under `if __name__ == \"__main__\":` (worker processes import "
              "your script)", file=sys.stderr)
        return 2
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(description="Train an agent with asynchronous PPO (APPO).")
    with collector_paused():  # torch's import, from the flag checks on (sf_core/machine/heap.py)
        try:
            # the forkserver's imports overlap ours; the preset's or env fit's lines once the flags are valid
            cfg, _ = parse_args(argv, parser, parsed=start_forkserver_early,
                                announce=lambda line: log.info("%s", line))
        except ConfigError as exc:
            print(f"sf_core.train: error: {exc}", file=sys.stderr)
            return 2
        except SystemExit as exc:  # --help
            return int(exc.code or 0)
        if cfg.machine_fit:
            where = "this machine" if not cfg.ray_address else "this machine; each cluster sampler refits its node"
            log.info("%s", describe(cfg, this_machine(cfg.device), where))

        from sf_core.run.runner import Runner

    try:
        return Runner(cfg, launched=launched).run()
    except (EnvNotFoundError, ConfigError) as exc:
        unknown = isinstance(exc.__cause__ or exc, UnregisteredEnvError)  # the runner's ConfigError wraps it
        print(f"sf_core.train: error: {exc}{unregistered_env_hint(cfg.env_module, False) if unknown else ''}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    exit_process(main())
