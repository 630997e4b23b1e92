"""`python -m sf_core.export --experiment=NAME --format=onnx|torchscript`: a policy runnable without sf_core.

Writes `{train_dir}/{experiment}/export/policy.onnx` (or `policy.pt`) and `policy.json`, which lists
the inputs and outputs (see sf_core/sharing/exported_policy.py and docs/sharing.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from sf_core.envs.registry import EnvNotFoundError, UnregisteredEnvError
from sf_core.cli import (add_env_module_argument, exit_process, import_experiment_modules,
                         unregistered_env_hint)
from sf_core.cli.arguments import _Parser
from sf_core.cli.train import setup_logging
from sf_core.config import ConfigError
from sf_core.sharing.exported_policy import FORMATS, export

log = logging.getLogger("sf_core")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m sf_core.export", description="Export a trained policy to ONNX or TorchScript.",
                formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument("--experiment", required=True, help="Experiment name.")
    add_env_module_argument(p)
    p.add_argument("--train_dir", default="train_dir", help="Root folder of experiments.")
    p.add_argument("--format", default="onnx", choices=sorted(FORMATS), help="File format.")
    p.add_argument("--checkpoint", default="latest", help="latest, best, or a checkpoint path.")
    p.add_argument("--policy_index", type=int, default=None,
                   help="Which policy of a run with --num_policies > 1 to export (default: the best one).")
    p.add_argument("--output", default=None,
                   help="File to write (default: {train_dir}/{experiment}/export/policy.onnx or policy.pt); "
                        "policy.json goes beside it.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    env_module = ""
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        env_module = import_experiment_modules(args.env_module, os.path.join(args.train_dir, args.experiment))
        path = export(os.path.join(args.train_dir, args.experiment), args.format, args.checkpoint, args.output,
                      args.policy_index)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except UnregisteredEnvError as exc:
        print(f"sf_core.export: error: {exc}{unregistered_env_hint(env_module)}", file=sys.stderr)
        return 1
    except (ConfigError, EnvNotFoundError, ValueError) as exc:
        print(f"sf_core.export: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except ImportError as exc:  # onnxscript is the export extra
        print(f"sf_core.export: error: {exc} (pip install -e '.[export]')", file=sys.stderr)
        return 1
    log.info("exported %s", path)
    return 0


if __name__ == "__main__":
    exit_process(main())
