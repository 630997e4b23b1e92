"""A trained policy outside training: the one loader behind `sf_core.enjoy` and the evaluator's workers.

    loaded = load_checkpoint("train_dir/exp", "latest")    # config + weights; the model's flags checked
    policy = loaded.policy(env.observation_space, env.action_space, deterministic=True)
    episode = policy.start_episode()                        # a zero recurrent state, for one episode
    action = policy.act([obs], episode)[0]                  # what env.step expects

The model is rebuilt from the experiment's config.json exactly as it was trained. It acts as the rollout
workers do: observations packed by `ObsWriter` (Dict/Tuple spaces into one byte row), the recurrent
state carried from step to step, actions converted for `env.step`. The state lives in an `EpisodeState`,
not in the policy, so one policy (one copy of the weights) can serve many episodes at once: the
evaluator's task threads share it.

A run of several policies (--num_policies) keeps each one's checkpoints in its own folder; the loader
takes the policy asked for (`policy_index`) or, by default, the best one (`choose_policy`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import torch

from algo.model import ActorCritic, ModelSpec
from algo.observations import ObsWriter, obs_storage
from sf_core.config import Config, ConfigError
from sf_core.records import checkpoint
from sf_core.records.experiment import load_config
from sf_core.sampling.split_runner import env_action_converter

log = logging.getLogger("sf_core")


@dataclass(frozen=True)
class PolicyCheckpoint:
    """An experiment's config and one of its checkpoints, ready to build the policy for an env's spaces."""

    cfg: Config
    path: str  # the checkpoint file
    version: int  # policy version the checkpoint holds
    weights: dict  # the model's state_dict
    spec: ModelSpec
    env_frames: int = 0  # env frames the run had trained on when it saved this checkpoint
    # which of the run's policies (--num_policies) this is; None for a path outside the policies' folders
    policy_index: int | None = 0
    # its learning values when saved (PBT may have changed them): a record only, the model does not use them
    hyperparams: dict = field(default_factory=dict)

    def policy(self, obs_space: gym.Space, action_space: gym.Space, deterministic: bool = False,
               device: str = "cpu") -> TrainedPolicy:
        model = ActorCritic(obs_space, action_space, self.spec).to(device)
        model.load_state_dict(self.weights)
        model.eval()
        return TrainedPolicy(model, obs_space, action_space, deterministic, device)


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
    path, index = _find_file(experiment_path, cfg, which, policy_index)
    return cfg, path, index


def _find_file(experiment_path: str, cfg: Config, which: str, policy_index: int | None) -> tuple[str, int | None]:
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


def locate_checkpoint(experiment_path: str, which: str = "latest", policy_index: int | None = None
                      ) -> tuple[Config, str, ModelSpec, int | None]:
    """`find_policy_checkpoint`, and the model's flags: ConfigError also when the model uses a custom
    part this process has not registered."""
    cfg = load_config(experiment_path)
    try:
        spec = ModelSpec.from_config(cfg)
    except ValueError as exc:  # a custom model part not registered in this process
        raise ConfigError(f"{exc} (to evaluate the policy, run from a script that registers it, "
                          f"see docs/models.md)") from None
    path, index = _find_file(experiment_path, cfg, which, policy_index)
    return cfg, path, spec, index


def load_checkpoint(experiment_path: str, which: str = "latest", device: str = "cpu",
                    policy_index: int | None = None) -> PolicyCheckpoint:
    """`locate_checkpoint`, then the checkpoint's weights, as saved."""
    cfg, path, spec, index = locate_checkpoint(experiment_path, which, policy_index)
    state = checkpoint.load(path, map_location=device)
    return PolicyCheckpoint(cfg, path, int(state["version"]), state["model"], spec,
                            int(state.get("runner", {}).get("frames", 0)), index, dict(state.get("hyperparams", {})))


class EpisodeState:
    """What a recurrent policy remembers during one episode, one row per agent (zeros: nothing yet)."""

    def __init__(self, rnn: torch.Tensor):
        self.rnn = rnn  # [agents, rnn_state_size]

    def agent_done(self, agent: int) -> None:
        """That agent's episode ended (a multi-agent env goes on): its next one starts from zeros."""
        self.rnn[agent] = 0.0


class TrainedPolicy:
    """A loaded model acting in an env with the given spaces. Holds no per-episode state, so several
    threads may act with it at once, each with its own EpisodeState."""

    def __init__(self, model: ActorCritic, obs_space: gym.Space, action_space: gym.Space, deterministic: bool,
                 device: str = "cpu"):
        self.model, self.deterministic, self.device = model, deterministic, device
        self.writer = ObsWriter(obs_space)
        self.row_shape, self.row_dtype = obs_storage(obs_space)
        self.to_env_action = env_action_converter(action_space)

    def start_episode(self, agents: int = 1) -> EpisodeState:
        return EpisodeState(self.model.initial_state(agents, self.device))

    @torch.no_grad()
    def act(self, observations: Sequence[Any], episode: EpisodeState) -> list[Any]:
        """One env action per agent's observation; advances the episode's recurrent state."""
        rows = torch.zeros((len(observations), *self.row_shape), dtype=self.row_dtype)
        for i, obs in enumerate(observations):
            self.writer.write(obs, rows.numpy()[i])
        params, _, episode.rnn = self.model.step(rows.to(self.device), episode.rnn)
        dist = self.model.distribution(params)
        actions = (dist.mode() if self.deterministic else dist.sample()).cpu().numpy()
        return [self.to_env_action(a) for a in actions]
