"""A trained policy outside training: the one loader behind `sf_core.enjoy` and the evaluator's workers.

    loaded = load_checkpoint("train_dir/exp", "latest")    # config + weights; the model's flags checked
    policy = loaded.policy(env.observation_space, env.action_space, deterministic=True)
    episode = policy.start_episode()                        # a zero recurrent state, for one episode
    action = policy.act([obs], episode)[0]                  # what env.step expects

The model is rebuilt from the experiment's config.json exactly as it was trained. It acts as the rollout
workers do (`TrainedPolicy`, sf_core/sampling/trained_policy.py, which training's periodic evaluation shares).

A run of several policies (--num_policies) keeps each one's checkpoints in its own folder; the loader
takes the policy asked for (`policy_index`) or, by default, the best one
(`sf_core.records.policy_choice.choose_policy`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import gymnasium as gym

from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.config import Config, ConfigError
from sf_core.records import checkpoint
from sf_core.records.experiment import load_config
from sf_core.records.policy_choice import find_file
from sf_core.sampling.trained_policy import EpisodeState, TrainedPolicy

__all__ = ["EpisodeState", "PolicyCheckpoint", "TrainedPolicy", "load_checkpoint", "locate_checkpoint"]

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
    path, index = find_file(experiment_path, cfg, which, policy_index)
    return cfg, path, spec, index


def load_checkpoint(experiment_path: str, which: str = "latest", device: str = "cpu",
                    policy_index: int | None = None) -> PolicyCheckpoint:
    """`locate_checkpoint`, then the checkpoint's weights, as saved."""
    cfg, path, spec, index = locate_checkpoint(experiment_path, which, policy_index)
    state = checkpoint.load(path, map_location=device)
    return PolicyCheckpoint(cfg, path, int(state["version"]), state["model"], spec,
                            int(state.get("runner", {}).get("frames", 0)), index, dict(state.get("hyperparams", {})))
