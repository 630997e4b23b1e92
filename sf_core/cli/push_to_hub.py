"""`python -m sf_core.huggingface.push_to_hub --experiment=NAME --hf_repository=user/name`: share an agent.

Stages what a Hub repository holds (`stage`): config.json, the final checkpoint, eval_results.json,
replay.mp4, a learning-curve PNG, the exported policy if `python -m sf_core.export` made one, and a
model card (README.md); then uploads that folder with huggingface_hub (`upload`). `--dry_run=True`
stops after staging, which is how it is tested without a network.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from typing import Sequence

from sf_core.cli import add_env_module_argument, exit_process, import_experiment_modules
from sf_core.cli.arguments import _Parser, add_bool_argument
from sf_core.cli.train import setup_logging
from sf_core.config import Config, ConfigError
from sf_core.records import checkpoint
from sf_core.records.experiment import load_config
from sf_core.records.policy_choice import find_policy_checkpoint
from sf_core.sharing.model_card import model_card

log = logging.getLogger("sf_core")

EVAL_RESULTS, VIDEO, CURVE = "eval_results.json", "replay.mp4", "learning_curve.png"


def stage(experiment_path: str, repo_id: str, folder: str, which: str = "latest",
          policy_index: int | None = None) -> list[str]:
    """Fill `folder` with the files the repository gets; returns their paths relative to it. Of a run of
    several policies, one goes: `policy_index`, by default the best (sf_core.records.policy_choice.choose_policy)."""
    cfg = load_config(experiment_path)
    results_path = os.path.join(experiment_path, EVAL_RESULTS)
    if not os.path.exists(results_path):
        raise ConfigError(f"{results_path} not found: evaluate first (python -m sf_core.enjoy "
                          f"--experiment={cfg.experiment} --train_dir=... --save_video=True)")
    with open(results_path) as f:
        results = json.load(f)
    _, ckpt, index = find_policy_checkpoint(experiment_path, which, policy_index)
    _check_evaluated_policy(cfg, results, index)
    # the policy's folder name stays, so that the loader finds it after load_from_hub: config.json still
    # says --num_policies, and the one policy with checkpoints is the one it picks by default
    directory = checkpoint.checkpoint_dir(folder, index or 0, cfg.num_policies)
    os.makedirs(directory, exist_ok=True)
    # the name stays: enjoy and resume look for checkpoint_v*_f*.pt after load_from_hub
    name = os.path.basename(ckpt)
    if not name.startswith("checkpoint_v"):  # best.pt or a path: named after its version and frames
        state = checkpoint.load(ckpt)
        name = checkpoint.PATTERN.format(version=state["version"], frames=state["runner"]["frames"])
    files = [os.path.join(os.path.basename(directory), name)]
    shutil.copyfile(ckpt, os.path.join(folder, files[0]))
    for optional in ("config.json", EVAL_RESULTS, VIDEO):
        if os.path.exists(os.path.join(experiment_path, optional)):
            shutil.copyfile(os.path.join(experiment_path, optional), os.path.join(folder, optional))
            files.append(optional)
    if VIDEO not in files:
        log.warning("no %s in %s: run python -m sf_core.enjoy with --save_video=True to add one", VIDEO,
                    experiment_path)
    files += _learning_curve(experiment_path, folder) + _exported(experiment_path, folder, index)
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write(model_card(cfg, results, repo_id, files))
    return ["README.md"] + files


def _check_evaluated_policy(cfg: Config, results: dict, index: int | None) -> None:
    """The card's score must be the uploaded policy's: eval_results.json says which policy it played."""
    if cfg.num_policies == 1:
        return
    if index is None:
        raise ConfigError("--checkpoint is not in a checkpoint_p{K}/ folder: name its policy with --policy_index")
    evaluated = results.get("policy_index")
    if evaluated != index:
        raise ConfigError(f"eval_results.json is policy {evaluated}'s evaluation, but policy {index} would be "
                          f"uploaded: run python -m sf_core.enjoy --policy_index={index} first, or push "
                          f"--policy_index={evaluated}")


def _learning_curve(experiment_path: str, folder: str) -> list[str]:
    from sf_core.cli.plot import plot

    train_dir, experiment = os.path.split(os.path.normpath(experiment_path))
    try:
        plot(train_dir, [experiment], os.path.join(folder, CURVE))
    except (ConfigError, ImportError) as exc:  # no episode logged yet, or no matplotlib
        log.warning("no learning curve: %s", exc)
        return []
    return [CURVE]


def _exported(experiment_path: str, folder: str, index: int | None) -> list[str]:
    source = os.path.join(experiment_path, "export")
    if not os.path.isdir(source):
        return []
    try:
        with open(os.path.join(source, "policy.json")) as f:
            exported = json.load(f).get("policy_index", 0)
    except (OSError, ValueError):
        exported = index  # nothing says otherwise
    if exported != index:  # another policy of the run: it would not be the uploaded agent
        log.warning("export/ holds policy %s, not policy %s: left out (python -m sf_core.export "
                    "--policy_index=%s)", exported, index, index)
        return []
    shutil.copytree(source, os.path.join(folder, "export"), dirs_exist_ok=True)
    return sorted(os.path.join("export", name) for name in os.listdir(source))


def upload(folder: str, repo_id: str, private: bool, api=None) -> str:
    """Create the repository if needed and upload the staged folder as one commit; returns its URL."""
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    url = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
    api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=folder,
                      commit_message="Upload sf_core agent")
    return str(url)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m sf_core.huggingface.push_to_hub", description="Push an agent to the Hugging Face Hub.",
                formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument("--experiment", required=True, help="Experiment name.")
    add_env_module_argument(p)
    p.add_argument("--train_dir", default="train_dir", help="Root folder of experiments.")
    p.add_argument("--hf_repository", required=True, help="Hub repository: user/name (created if missing).")
    p.add_argument("--checkpoint", default="latest", help="latest, best, or a checkpoint path.")
    p.add_argument("--policy_index", type=int, default=None,
                   help="Which policy of a run with --num_policies > 1 to upload (default: the best one).")
    add_bool_argument(p, "private", False, "Create the repository as private.")
    p.add_argument("--staging_dir", default=None, help="Stage the files here and keep them (default: a temporary "
                   "folder, deleted after the upload).")
    add_bool_argument(p, "dry_run", False, "Stage only; upload nothing.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        import_experiment_modules(args.env_module, os.path.join(args.train_dir, args.experiment))
        with tempfile.TemporaryDirectory(prefix="sf_core_hub_") as tmp:
            folder = args.staging_dir or tmp
            files = stage(os.path.join(args.train_dir, args.experiment), args.hf_repository, folder, args.checkpoint,
                          args.policy_index)
            log.info("staged %d files in %s: %s", len(files), folder, ", ".join(files))
            if not args.dry_run:
                log.info("uploaded: %s", upload(folder, args.hf_repository, args.private))
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except ConfigError as exc:
        print(f"sf_core.huggingface.push_to_hub: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"sf_core.huggingface.push_to_hub: error: {exc} (pip install -e '.[huggingface]')", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    exit_process(main())
