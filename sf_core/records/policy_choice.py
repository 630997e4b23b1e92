"""Which checkpoint file of an experiment's records a command means: of a run of several policies, the one
asked for or the best (`choose_policy`), and its latest, best or named file (`find_policy_checkpoint`)."""

from __future__ import annotations

import json
import logging
import math
import os
import re

from sf_core.config import Config, ConfigError
from sf_core.records import checkpoint
from sf_core.records.experiment import load_config

log = logging.getLogger("sf_core")


def choose_policy(experiment_path: str, cfg: Config, policy_index: int | None = None) -> int:
    """Which of the experiment's policies to load: `policy_index` if given (checked against the run's
    --num_policies), else the best one (for a run of one policy, that one)."""
    n = cfg.num_policies
    if policy_index is not None:
        if not 0 <= policy_index < n:
            choices = "0" if n == 1 else f"0 to {n - 1}"
            raise ConfigError(f"--policy_index={policy_index}: {experiment_path} trained {n} "
                              f"polic{'y' if n == 1 else 'ies'}, so the index must be {choices} "
                              f"({_folders_with_checkpoints(experiment_path, n)})")
        return policy_index
    if n == 1:
        return 0
    index, reason = best_policy(experiment_path, n)
    log.info("loading policy %d of %d: %s (choose another with --policy_index)", index, n, reason)
    return index


def best_policy(experiment_path: str, num_policies: int) -> tuple[int, str]:
    """The best policy of a run of several, and why: the one training_summary.json names (what the
    runner ranked, over all its recent episodes), else the highest mean return that a policy's latest
    checkpoint recorded. Only policies with a checkpoint count: a shared folder may hold just one."""
    latest = {k: checkpoint.latest_checkpoint(checkpoint.checkpoint_dir(experiment_path, k, num_policies))
              for k in range(num_policies)}
    saved = {k: path for k, path in latest.items() if path is not None}
    if not saved:
        raise ConfigError(f"no checkpoint in {experiment_path}: "
                          f"{_folders_with_checkpoints(experiment_path, num_policies)}")
    named = _summary_best_policy(experiment_path)
    if named in saved:
        return named, "training_summary.json names it the best policy"
    why = "" if named is None else f"; training_summary.json names policy {named}, which has no checkpoint"
    returns = {k: checkpoint.load(path).get("runner", {}).get("mean_return") for k, path in saved.items()}
    ranked = {k: float(r) for k, r in returns.items() if r is not None and not math.isnan(float(r))}
    if not ranked:
        first = min(saved)
        return first, f"no checkpoint records a mean return yet, so the first policy with a checkpoint{why}"
    best = max(ranked, key=lambda k: (ranked[k], -k))  # a tie goes to the lower index
    others = ", ".join(f"policy {k}: {r:.2f}" for k, r in sorted(ranked.items()) if k != best)
    return best, (f"the highest mean return in its latest checkpoint, {ranked[best]:.2f}"
                  f"{' (' + others + ')' if others else ''}{why}")


def _summary_best_policy(experiment_path: str) -> int | None:
    try:
        with open(os.path.join(experiment_path, "training_summary.json")) as f:
            named = json.load(f).get("best_policy")
    except (OSError, ValueError, AttributeError):  # missing, half-copied or not a dict: rank the checkpoints
        return None
    return named if isinstance(named, int) else None


def _folders_with_checkpoints(experiment_path: str, num_policies: int) -> str:
    folders = [checkpoint.checkpoint_dir(experiment_path, k, num_policies) for k in range(num_policies)]
    found = [os.path.basename(d) + "/" for d in folders if checkpoint.latest_checkpoint(d)]
    return f"checkpoints in {', '.join(found)}" if found else "it holds no checkpoint yet"


def _policy_of_path(path: str, num_policies: int, policy_index: int | None) -> int | None:
    """The policy whose folder holds checkpoint file `path` (checkpoint_p{K}/), or the one the caller names."""
    folder = re.fullmatch(r"checkpoint_p(\d+)", os.path.basename(os.path.dirname(os.path.abspath(path))))
    if folder is None:
        return 0 if num_policies == 1 and policy_index is None else policy_index
    if policy_index is not None and policy_index != int(folder.group(1)):
        raise ConfigError(f"--checkpoint={path} is policy {folder.group(1)}'s but --policy_index={policy_index}")
    return int(folder.group(1))


def find_policy_checkpoint(experiment_path: str, which: str = "latest", policy_index: int | None = None
                           ) -> tuple[Config, str, int | None]:
    """The experiment's config, the file of checkpoint `which` (latest, best or a path) of policy
    `policy_index` (default: the best, see `choose_policy`), and that policy's index. ConfigError when
    the experiment, the policy or the checkpoint does not exist."""
    cfg = load_config(experiment_path)
    path, index = find_file(experiment_path, cfg, which, policy_index)
    return cfg, path, index


def find_file(experiment_path: str, cfg: Config, which: str, policy_index: int | None) -> tuple[str, int | None]:
    n = cfg.num_policies
    if which in ("latest", "best"):
        index = choose_policy(experiment_path, cfg, policy_index)
        path = checkpoint.find_checkpoint(experiment_path, which, index, n)
        if path is None:
            where = "" if n == 1 else f" ({_folders_with_checkpoints(experiment_path, n)})"
            folder = checkpoint.checkpoint_dir(experiment_path, index, n)
            raise ConfigError(f"no checkpoint {which!r} in {folder}{where}")
        return path, index
    if policy_index is not None:
        choose_policy(experiment_path, cfg, policy_index)  # an index the run does not have is an error
    if not os.path.exists(which):
        raise ConfigError(f"no checkpoint {which!r}: no such file")
    return which, _policy_of_path(which, n, policy_index)
