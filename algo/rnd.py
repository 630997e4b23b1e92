"""APPO + RND, random network distillation (Burda et al. 2018, "Exploration by Random Network Distillation"):
`--algo=APPO_RND`.

The idea: a fixed, randomly initialised *target* network maps each observation to an embedding, and a
*predictor* network is trained to reproduce it. On observations like those it has trained on the predictor is
accurate; on new ones it is not. Its error is therefore a novelty signal, paid to the agent as an *intrinsic
reward* on top of the env's. A separate *intrinsic critic* learns the values of the intrinsic returns, so the
policy's advantages are a weighted sum of two GAE estimates:

    A = rnd_ext_coeff · A_ext + rnd_int_coeff · A_int

As in the paper (and CleanRL's ppo_rnd_envpool.py):
- both networks see observations whitened by running statistics and clipped to [-5, 5], so that the random
  target's embedding varies with the observation whatever the observation's scale;
- the intrinsic reward is the prediction error divided by the running std of the discounted intrinsic return,
  so its scale does not drift as the predictor improves;
- intrinsic returns are non-episodic: novelty behind an episode end still counts, so ending an episode early
  is no way out of finding new states (the extrinsic GAE stops at episode ends as usual);
- the predictor trains on a random `rnd_update_proportion` of the samples, so it does not catch up with the
  novelty too fast.

The graph, in the order it runs (the models it calls in brackets):
  1. lag mask, extrinsic values, fold truncation      (sf_core.algo.algorithms.common_nodes)
  2. extrinsic_gae       the env reward's advantages and the value head's targets
  3. rnd_whiten          next observations whitened by the predictor's statistics      [rnd_predictor]
  4. rnd_target, rnd_predictor   the two embeddings: independent nodes of one generation [rnd_target],
                         [rnd_predictor]
  5. intrinsic_reward    prediction error / its running scale
  6. intrinsic_values, intrinsic_gae   V_int and non-episodic GAE with its own discount   [intrinsic_critic]
  7. combine_advantages  the weighted sum above, under the key the stock PPO update reads
  8. ppo_update, rnd_predictor_update, intrinsic_critic_update   one train_step per trained model

Observations: a flat Box (the networks are MLPs) or an image, of which RND reads the newest frame
(algo/rnd_networks.py).
"""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym
import torch

from sf_core.algo import nodes as n
from sf_core.algo.adam import make_adam
from sf_core.algo.algorithms import TARGET_INPUTS, UPDATE_INPUTS, Algorithm, common_nodes
from sf_core.algo.graph import Context, ModelSlot, Node
from sf_core.algo.model import ActorCritic
from sf_core.algo.params import LearningParams
from sf_core.algo.ppo import masked_mean
from sf_core.algo.rnd_networks import IntrinsicCritic, RNDInput, RNDPredictor, RNDTarget
from sf_core.algo.targets import discounted_cumsum, gae
from sf_core.config import Config, ConfigError, register_check

Inputs = dict[str, Any]


# 1. models: algo/rnd_networks.py --------------------------------------------------------------------------------
def check_spaces(obs_space: gym.Space, action_space: gym.Space) -> None:
    RNDInput.of(obs_space)


def rnd_input(actor_critic: ActorCritic) -> RNDInput:
    """RNDInput.of the space the actor-critic was built for (a Dict or Tuple: refused)."""
    preprocess = actor_critic.preprocess
    if preprocess.packed is None:
        return RNDInput.of(preprocess.fields[0].space)
    return RNDInput.of(gym.spaces.Dict({f.key: f.space for f in preprocess.fields}))


def rnd_models(models: dict[str, ModelSlot], hidden: int) -> dict[str, ModelSlot]:
    """The target (frozen), the predictor and the intrinsic critic (trained, each with its own Adam), on the
    learner's device. A learner group's ranks all seed torch alike before building their models, so every
    rank draws the same random target."""
    learner = models["actor_critic"]
    inp, device = rnd_input(learner.module), learner.device
    target = RNDTarget(inp, hidden).to(device)
    predictor = RNDPredictor(inp, hidden).to(device)
    critic = IntrinsicCritic(inp, hidden).to(device)
    return {"rnd_target": ModelSlot(target, None, device),
            "rnd_predictor": ModelSlot(predictor, make_adam(predictor.parameters(), device), device),
            "intrinsic_critic": ModelSlot(critic, make_adam(critic.parameters(), device), device)}


# 2. extrinsic targets -------------------------------------------------------------------------------------------
def extrinsic_gae(ctx: Context, x: Inputs) -> Inputs:
    """The stock GAE node, its advantages renamed: "advantages" is the combination (step 7)."""
    out = n.gae_targets(ctx, x)
    return {"extrinsic_advantages": out["advantages"], "value_targets": out["value_targets"]}


# 3.-5. intrinsic reward -----------------------------------------------------------------------------------------
def rnd_whiten(ctx: Context, x: Inputs) -> Inputs:
    """The predictor's running statistics, applied: rows 1..T of obs whitened (step t's intrinsic reward is the
    novelty of the observation it led to), and the scale the prediction errors are divided by."""
    predictor = ctx.models["rnd_predictor"].module
    return {"rnd_obs": predictor.whiten(x["obs"][1:]), "rnd_error_scale": predictor.reward_scale()}


def rnd_target(ctx: Context, x: Inputs) -> Inputs:
    return {"rnd_target_features": ctx.models["rnd_target"].module(x["rnd_obs"])}


def rnd_predict(ctx: Context, x: Inputs) -> Inputs:
    return {"rnd_predicted_features": ctx.models["rnd_predictor"].module(x["rnd_obs"])}


def intrinsic_reward(ctx: Context, x: Inputs) -> Inputs:
    errors = (x["rnd_predicted_features"] - x["rnd_target_features"]).pow(2).mean(-1)  # [T, N]
    rewards = errors / x["rnd_error_scale"]
    mask = x["mask"]
    return {"rnd_errors": errors, "intrinsic_rewards": rewards, "rnd_stats": {
        "rnd_intrinsic_reward_mean": masked_mean(rewards, mask).item(),
        "rnd_intrinsic_reward_max": (rewards * mask).max().item(),
        "rnd_prediction_error_mean": masked_mean(errors, mask).item()}}


# 6.-7. intrinsic targets, combined advantages -------------------------------------------------------------------
def intrinsic_values(ctx: Context, x: Inputs) -> Inputs:
    return {"intrinsic_values": ctx.models["intrinsic_critic"].module(x["obs"])}  # [T+1, N]: row T bootstraps


def intrinsic_gae(ctx: Context, x: Inputs) -> Inputs:
    """Non-episodic: no step ends the intrinsic return (see the module docstring)."""
    rewards = x["intrinsic_rewards"]
    advantages, targets = gae(rewards, x["intrinsic_values"], torch.zeros_like(rewards), ctx.params.rnd_gamma,
                              ctx.params.gae_lambda)
    return {"intrinsic_advantages": advantages, "intrinsic_value_targets": targets}


def combine_advantages(ctx: Context, x: Inputs) -> Inputs:
    p = ctx.params
    return {"advantages": p.rnd_ext_coeff * x["extrinsic_advantages"] + p.rnd_int_coeff * x["intrinsic_advantages"]}


# 8. updates -----------------------------------------------------------------------------------------------------
def rnd_predictor_update(ctx: Context, x: Inputs) -> Inputs:
    """MSE to the target's embedding on a random share of the samples, then this dataset's statistics folded
    in: its rewards and the target's embedding were computed with the statistics from before it, and the
    predictor learns on the same whitened inputs."""
    p, slot = ctx.params, ctx.models["rnd_predictor"]
    predictor = slot.module
    whitened, target = x["rnd_obs"].flatten(0, 1), x["rnd_target_features"].flatten(0, 1)
    mask = x["mask"].flatten()
    chosen = (torch.rand(mask.shape, device=mask.device, generator=ctx.generator) < p.rnd_update_proportion)
    chosen = chosen.float() * mask
    loss = fit(ctx, slot, lambda idx: (predictor(whitened[idx]) - target[idx]).pow(2).mean(-1), chosen)

    active = x["mask"].bool()
    predictor.update_obs_stats(x["obs"][1:][active], ctx.gather)
    # The paper keeps a running discounted sum per env. A batch's columns are not the same envs from one dataset
    # to the next, so the discounted return within each trajectory stands in for it.
    returns = discounted_cumsum(x["rnd_errors"], torch.full_like(x["rnd_errors"], p.rnd_gamma))
    predictor.return_norm.update(returns[active], ctx.gather)
    return {"rnd_predictor_stats": {"rnd_predictor_loss": loss,
                                    "rnd_trained_fraction": float(chosen.sum()) / max(1.0, float(mask.sum()))}}


def intrinsic_critic_update(ctx: Context, x: Inputs) -> Inputs:
    """MSE to the intrinsic value targets. The statistics are folded in first, as the PPO update does for the
    actor-critic's input normalisation."""
    slot = ctx.models["intrinsic_critic"]
    critic = slot.module
    obs, targets = x["obs"][:-1].flatten(0, 1), x["intrinsic_value_targets"].flatten()
    mask = x["mask"].flatten()
    critic.update_obs_stats(obs[mask.bool()], ctx.gather)
    loss = fit(ctx, slot, lambda idx: 0.5 * (critic(obs[idx]) - targets[idx]).pow(2), mask)
    return {"intrinsic_critic_stats": {"rnd_intrinsic_value_loss": loss,
                                       "rnd_intrinsic_value_mean": masked_mean(x["intrinsic_values"][:-1],
                                                                               x["mask"]).item()}}


def fit(ctx: Context, slot: ModelSlot, sample_losses: Callable[[torch.Tensor], torch.Tensor],
        weights: torch.Tensor) -> float:
    """Minibatch SGD on per-sample losses: --num_epochs passes in minibatches of --batch_size samples, each
    sample's loss weighted by `weights` (0: not trained on). Returns the mean minibatch loss. Every rank of a
    learner group makes the same number of steps (equal shares), each with the mean gradient of all."""
    p = ctx.params
    for group in slot.optimizer.param_groups:  # read at every call: --policy_hyperparams or PBT may change it
        group["lr"] = p.rnd_learning_rate
    parameters = list(slot.module.parameters())
    max_norm = p.max_grad_norm if p.max_grad_norm > 0 else float("inf")
    count = weights.numel()
    total, steps = torch.zeros((), device=weights.device), 0  # summed on the device, read once
    for _ in range(p.num_epochs):
        order = n.minibatch_order(ctx, count, weights.device)
        for start in range(0, count, p.batch_size):
            idx = order[start:start + p.batch_size]
            loss = masked_mean(sample_losses(idx), weights[idx])
            slot.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            ctx.average_gradients(parameters)
            torch.nn.utils.clip_grad_norm_(parameters, max_norm)
            slot.optimizer.step()
            total += loss.detach()
            steps += 1
    return (total / max(1, steps)).item()


# the graph ------------------------------------------------------------------------------------------------------
def appo_rnd(params: LearningParams) -> Algorithm:
    """APPO whose advantages add RND's intrinsic ones (GAE targets, whatever --with_vtrace says)."""
    embeddings, intrinsic = ("rnd_target_features", "rnd_predicted_features"), ("intrinsic_rewards", "intrinsic_values")
    nodes = common_nodes(params) + [
        Node("extrinsic_gae", "compute", TARGET_INPUTS, ("extrinsic_advantages", "value_targets"), extrinsic_gae),
        Node("rnd_whiten", "inference", ("obs",), ("rnd_obs", "rnd_error_scale"), rnd_whiten, model="rnd_predictor"),
        Node("rnd_target", "inference", ("rnd_obs",), ("rnd_target_features",), rnd_target, model="rnd_target"),
        Node("rnd_predictor", "inference", ("rnd_obs",), ("rnd_predicted_features",), rnd_predict,
             model="rnd_predictor"),
        Node("intrinsic_reward", "compute", embeddings + ("rnd_error_scale", "mask"),
             ("rnd_errors", "intrinsic_rewards", "rnd_stats"), intrinsic_reward),
        Node("intrinsic_values", "inference", ("obs",), ("intrinsic_values",), intrinsic_values,
             model="intrinsic_critic"),
        Node("intrinsic_gae", "compute", intrinsic, ("intrinsic_advantages", "intrinsic_value_targets"),
             intrinsic_gae),
        Node("combine_advantages", "compute", ("extrinsic_advantages", "intrinsic_advantages"), ("advantages",),
             combine_advantages),
        Node("ppo_update", "train_step", UPDATE_INPUTS, ("train_stats",), n.ppo_update, model="actor_critic"),
        Node("rnd_predictor_update", "train_step", ("obs", "rnd_obs", "rnd_target_features", "rnd_errors", "mask"),
             ("rnd_predictor_stats",), rnd_predictor_update, model="rnd_predictor"),
        Node("intrinsic_critic_update", "train_step", ("obs", "intrinsic_values", "intrinsic_value_targets", "mask"),
             ("intrinsic_critic_stats",), intrinsic_critic_update, model="intrinsic_critic"),
    ]
    return Algorithm(nodes, extra_models=lambda models: rnd_models(models, params.rnd_hidden),
                     check_spaces=check_spaces)


@register_check
def check_rnd_flags(cfg: Config) -> None:
    if cfg.algo != "APPO_RND":
        return
    if not 0.0 < cfg.rnd_update_proportion <= 1.0:
        raise ConfigError(f"--rnd_update_proportion must be in (0, 1], got {cfg.rnd_update_proportion}")
    if not 0.0 <= cfg.rnd_gamma <= 1.0:
        raise ConfigError(f"--rnd_gamma must be in [0, 1], got {cfg.rnd_gamma}")
    if not cfg.rnd_learning_rate > 0 or cfg.rnd_hidden < 1:
        raise ConfigError(f"--rnd_learning_rate must be positive and --rnd_hidden at least 1, got "
                          f"{cfg.rnd_learning_rate} and {cfg.rnd_hidden}")
