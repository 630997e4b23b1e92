"""`python -m sf_core.huggingface.load_from_hub --hf_repository=user/name`: an agent from the Hub as an
experiment folder, `{train_dir}/{experiment}/` (experiment: the repository's name unless given), ready
for `python -m sf_core.enjoy`, `python -m sf_core.export` or resumed training.

The repository is fetched with huggingface_hub's `snapshot_download` into its cache (so offline,
`HF_HUB_OFFLINE=1`, a cached snapshot is used) and copied from there; `--local_snapshot=DIR` takes a
folder laid out like the repository instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from typing import Sequence

from sf_core.cli import exit_process
from sf_core.cli.arguments import _Parser
from sf_core.cli.train import setup_logging
from sf_core.config import ConfigError

log = logging.getLogger("sf_core")


def download(repo_id: str, revision: str | None = None) -> str:
    """The repository's snapshot folder in the huggingface_hub cache (downloaded if not there)."""
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id=repo_id, repo_type="model", revision=revision)


def install(snapshot: str, train_dir: str, experiment: str) -> str:
    """Copy a snapshot into `{train_dir}/{experiment}`; returns that path. Cache snapshots hold symlinks
    into a blob store: the copies are real files."""
    if not os.path.exists(os.path.join(snapshot, "config.json")):
        raise ConfigError(f"{snapshot} holds no config.json: not an sf_core agent")
    path = os.path.join(train_dir, experiment)
    shutil.copytree(snapshot, path, dirs_exist_ok=True, symlinks=False,
                    ignore=shutil.ignore_patterns(".cache", ".git*"))
    return path


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m sf_core.huggingface.load_from_hub", description="Load an agent from the Hub.",
                formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument("--hf_repository", required=True, help="Hub repository: user/name.")
    p.add_argument("--train_dir", default="train_dir", help="Root folder of experiments.")
    p.add_argument("--experiment", default=None, help="Experiment folder name (default: the repository's name).")
    p.add_argument("--revision", default=None, help="Branch, tag or commit (default: main).")
    p.add_argument("--local_snapshot", default=None, help="Copy from this folder instead of the Hub.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        snapshot = args.local_snapshot or download(args.hf_repository, args.revision)
        path = install(snapshot, args.train_dir, args.experiment or args.hf_repository.split("/")[-1])
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except ConfigError as exc:
        print(f"sf_core.huggingface.load_from_hub: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"sf_core.huggingface.load_from_hub: error: {exc} (pip install -e '.[huggingface]')", file=sys.stderr)
        return 1
    except Exception as exc:  # huggingface_hub's errors: not found, offline without a cached snapshot
        print(f"sf_core.huggingface.load_from_hub: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    log.info("loaded %s into %s: python -m sf_core.enjoy --experiment=%s --train_dir=%s", args.hf_repository,
             path, os.path.basename(path), args.train_dir)
    return 0


if __name__ == "__main__":
    exit_process(main())
