"""Built-in algorithms as graphs, and the registry `--algo` picks from.

An algorithm is a list of nodes plus, optionally, extra models it calls (a frozen reference policy,
a reward model). The learner provides the trainable `actor_critic` and a batch whose keys are the
sample fields (`sf_core/contracts/sample.py`: obs, actions, log_prob, behaviour_values, rewards, ...); everything
else is produced by nodes. A builder takes the typed hyperparameters (`sf_core.algo.params.LearningParams`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import gymnasium as gym
import torch

from sf_core.algo import nodes as n
from sf_core.algo.graph import GraphError, ModelSlot, Node
from sf_core.algo.params import LearningParams
from sf_core.config import Config, ConfigError


@dataclass
class Algorithm:
    nodes: list[Node]
    # builds extra models from the learner's: name -> ModelSlot (e.g. a frozen reference policy)
    extra_models: Callable[[dict[str, ModelSlot]], dict[str, ModelSlot]] = field(default=lambda slots: {})
    # where extra models run unless --model_devices says otherwise (name -> device; unnamed: the learner's)
    devices: dict[str, str] = field(default_factory=dict)
    # raises ConfigError for an env it cannot train on (its spaces), in the runner, before any process starts
    check_spaces: Callable[[gym.Space, gym.Space], None] = field(default=lambda obs_space, action_space: None)
    # models that are shares of another's parameters (name -> that model, e.g. the actor of --split_actor_critic
    # -> actor_critic): they run where it runs
    parts: dict[str, str] = field(default_factory=dict)
    # the nodes after which the weights inference acts with are final for a dataset, when it needs no values from
    # acting (Config.values_at_learner): the learner publishes them and hands the dataset back there, while the
    # nodes left train on (the critic of --split_actor_critic: algo/executor.py, "Release")
    release_after: tuple[str, ...] = ()


RECOMPUTE = Node("recompute", "inference", ("obs", "actions", "rnn_states", "episode_ends"),
                 ("values", "target_log_prob"), n.recompute,
                 model="actor_critic")
# the values targets are computed against: the behaviour policy's (as PPO does) or RECOMPUTE's
BEHAVIOUR_VALUES = Node("behaviour_values", "compute", ("behaviour_values",), ("values",), n.behaviour_values)


def check_values_source(cfg: Config, nodes: list[Node]) -> None:
    """Where inference leaves the values to the learner (Config.values_at_learner), no node may read the ones it
    would have written."""
    readers = [node.name for node in nodes if "behaviour_values" in node.input_keys]
    if cfg.values_at_learner() and readers:
        raise ConfigError(f"--recompute_values=True with a critic of its own: inference runs the actor alone and "
                          f"writes no behaviour_values, but node {readers[0]!r} of --algo={cfg.algo} reads them")


def common_nodes(params: LearningParams, rewards_key: str = "rewards", recompute: bool = False) -> list[Node]:
    """Lag mask, values, truncation folded into rewards: shared by all three algorithms."""
    values = RECOMPUTE if recompute or params.recompute_values else BEHAVIOUR_VALUES
    return [
        Node("lag_mask", "compute", ("policy_version", "inactive"), ("mask", "lag_stats"), n.lag_mask),
        values,
        Node("fold_truncation", "compute", (rewards_key, "truncated", "trunc_values", "dones"),
             ("shaped_rewards", "episode_ends"), n.fold_truncation(rewards_key)),
    ]


TARGET_INPUTS = ("shaped_rewards", "values", "episode_ends")
UPDATE_INPUTS = ("obs", "actions", "log_prob", "advantages", "value_targets", "values", "mask", "rnn_states",
                 "episode_ends", "inactive")


def ppo(params: LearningParams, rewards_key: str = "rewards") -> Algorithm:
    return Algorithm(common_nodes(params, rewards_key) + [
        Node("gae", "compute", TARGET_INPUTS, ("advantages", "value_targets"), n.gae_targets),
        Node("ppo_update", "train_step", UPDATE_INPUTS, ("train_stats",), n.ppo_update, model="actor_critic"),
    ])


def appo(params: LearningParams, rewards_key: str = "rewards") -> Algorithm:
    """PPO on possibly stale samples; with --with_vtrace the targets correct for the policy lag."""
    if not params.with_vtrace:
        return ppo(params, rewards_key)
    # V-trace needs the current policy's log-probs, so it always recomputes (values come along free)
    return Algorithm(common_nodes(params, rewards_key, recompute=True) + [
        Node("vtrace", "compute", TARGET_INPUTS + ("target_log_prob", "log_prob"), ("advantages", "value_targets"),
             n.vtrace_targets),
        Node("ppo_update", "train_step", UPDATE_INPUTS, ("train_stats",), n.ppo_update, model="actor_critic"),
    ])


def reinforce(params: LearningParams, rewards_key: str = "rewards") -> Algorithm:
    return Algorithm(common_nodes(params, rewards_key) + [
        Node("monte_carlo_returns", "compute", TARGET_INPUTS, ("advantages", "value_targets"),
             n.monte_carlo_targets),
        Node("policy_gradient_update", "train_step", UPDATE_INPUTS, ("train_stats",), n.policy_gradient_update,
             model="actor_critic"),
    ])


def with_policy_loss(algorithm: Algorithm, loss: n.PolicyLoss) -> Algorithm:
    """`algorithm` with `loss` as its update's policy loss (docs/algorithms.md, "A policy loss of your own"); the
    value loss, the entropy bonus, the minibatches and the epochs stay as they were."""
    updates = [node for node in algorithm.nodes if isinstance(node.fn, n.SGDUpdate)]
    if len(updates) != 1:
        raise GraphError(f"with_policy_loss: the algorithm must have one minibatch SGD update, it has {len(updates)}")
    update = updates[0]
    algorithm.nodes = [dataclasses.replace(node, fn=dataclasses.replace(update.fn, policy_loss=loss))
                       if node is update else node for node in algorithm.nodes]
    return algorithm


def frozen_copy(slot: ModelSlot, offload_device: str | None = None) -> ModelSlot:
    """A non-trainable snapshot of a model, e.g. the reference policy of a KL penalty."""
    module = copy.deepcopy(slot.module).requires_grad_(False).eval()
    return ModelSlot(module, optimizer=None, device=slot.device, offload_device=offload_device)


def frozen_from_checkpoint(slot: ModelSlot, path: str, offload_device: str | None = None) -> ModelSlot:
    """Like `frozen_copy`, with the weights of a saved checkpoint (same architecture)."""
    frozen = frozen_copy(slot, offload_device)
    state = torch.load(path, map_location="cpu", weights_only=True)
    frozen.module.load_state_dict(state["model"])
    return frozen
