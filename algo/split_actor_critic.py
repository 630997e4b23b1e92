"""The actor and the critic as two models of the graph: `--split_actor_critic=True`.

With separate bodies (`--actor_critic_share_weights=False`) the actor-critic's loss

    policy loss + value_loss_coeff · value loss − exploration_loss_coeff · entropy

already falls apart: the policy and entropy terms reach only the actor's parameters, the value term only the
critic's. Trained as one model the two halves still share one optimizer step, one gradient clipping over
both and one minibatch order. Split, each half is a model of the graph with its own train_step, its own Adam,
its own clipping (--max_grad_norm for each half's gradients) and its own minibatch order, so the two train at
once under --overlap_graph_nodes: on a CPU a core each, on a GPU a CUDA stream each.

The split changes the graph, not the network. The actor-critic stays one module, the one inference, checkpoints,
export and enjoy use (the split implies separate bodies), and the two models are views of its halves:

    actor    observation normalisation -> actor body  -> action head
    critic   observation normalisation -> critic body -> value head       (and the returns normalisation)

The observation normalisation is the halves' only shared state, so a node of its own folds each dataset's
observations into it before either half trains. The algorithm's minibatch SGD update (an `SGDUpdate`: APPO's
and PPO's ppo_update, REINFORCE's, APPO_TEACHER's, APPO_RND's) becomes three train_steps:

    fold_obs_statistics [actor_critic]  the dataset's observations into the normalisation both halves read
    actor_update        [actor]         the update's own policy loss − exploration_loss_coeff · entropy, for
                                        its epochs, with its extra keys (a teacher's distribution)
    critic_update       [critic]        value_loss_coeff · the (clipped) value loss, for the update's epochs,
                                        after the dataset's returns are folded into the returns normalisation

Each half's loss and gradients are those of the whole model's loss for its parameters: with no clipping and the
same minibatch order, a split update equals the joint one (tests/test_split_actor_critic.py). Feed-forward
models only: a recurrent core's state would have to be split the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from sf_core.algo import nodes as n
from sf_core.algo import ppo
from sf_core.algo.adam import make_adam
from sf_core.algo.algorithms import Algorithm
from sf_core.algo.graph import Context, ModelSlot, Node
from sf_core.algo.model import ActorCritic
from sf_core.algo.non_finite import StepGuard
from sf_core.config import Config, ConfigError, register_check

Inputs = dict[str, Any]
WHOLE = "actor_critic"


# the two models -------------------------------------------------------------------------------------------------
class Actor(nn.Module):
    """observation -> action-distribution parameters, through the whole model's actor body and action head."""

    def __init__(self, whole: ActorCritic):
        super().__init__()
        self.preprocess, self.body, self.head = whole.preprocess, whole.actor, whole.action_head

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.body.decode(self.body.encode(self.preprocess.prepare(obs))))

    def distribution(self, params: torch.Tensor):
        return self.head.distribution(params)


class Critic(nn.Module):
    """observation -> value in normalized units, through the whole model's critic body and value head."""

    def __init__(self, whole: ActorCritic):
        super().__init__()
        self.preprocess, self.body, self.head = whole.preprocess, whole.critic, whole.value_head
        self.returns_norm = whole.returns_norm
        self.normalize_value = whole.normalize_value  # the whole's functions of the returns normalisation

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.body.decode(self.body.encode(self.preprocess.prepare(obs)))).squeeze(-1)


def split_models(models: dict[str, ModelSlot]) -> dict[str, ModelSlot]:
    """The actor and the critic of the learner's actor-critic, each with its own Adam on the whole's device."""
    whole = models[WHOLE]
    module: ActorCritic = whole.module
    if module.critic is None or module.recurrent:
        raise ConfigError("--split_actor_critic needs a feed-forward actor-critic with separate bodies")
    halves = {"actor": Actor(module), "critic": Critic(module)}
    owned = [{id(p) for p in half.parameters()} for half in halves.values()]
    assert not owned[0] & owned[1] and owned[0] | owned[1] == {id(p) for p in module.parameters()}, \
        "the actor and the critic must share out the actor-critic's parameters"
    return {name: ModelSlot(half, make_adam(half.parameters(), whole.device), whole.device, part_of=WHOLE)
            for name, half in halves.items()}


# the nodes ------------------------------------------------------------------------------------------------------
def fold_obs_statistics(ctx: Context, x: Inputs) -> Inputs:
    """The dataset's observations (those agents acted on) into the normalisation both halves read. Its output is
    a mark both halves read, so neither starts before the fold; they take the observations from the batch (a
    rank of --model_ranks takes its own model's share of them, not this node's)."""
    obs = x["obs"][:-1].flatten(0, 1)
    if x["inactive"].any():
        obs = obs[~x["inactive"].flatten()]
    ctx.models[WHOLE].module.update_obs_stats(obs, ctx.gather)
    return {"obs_folded": True}


def minibatches(ctx: Context, samples: dict[str, torch.Tensor], epochs: int) -> Iterator[dict[str, torch.Tensor]]:
    """[T, N, ...] tensors as minibatches of --batch_size samples, in this call's own order, for `epochs` passes;
    each with its "weights" (the mask over its count)."""
    flat = {key: value.flatten(0, 1) for key, value in samples.items()}
    for mb in n.epoch_minibatches(ctx, flat, ctx.params.batch_size, epochs, dim=0):
        mb["weights"] = mb["mask"] / mb["mask"].sum().clamp_min(1.0)
        yield mb


def mean_stats(totals: torch.Tensor | None, steps: int, names: tuple[str, ...]) -> dict[str, float]:
    return dict(zip(names, (totals / steps).tolist())) if totals is not None else {}


@dataclass(frozen=True)
class ActorUpdate:
    """The actor's train_step: `update`'s policy loss minus the entropy bonus, for `update`'s epochs."""

    update: n.SGDUpdate

    def __call__(self, ctx: Context, x: Inputs) -> Inputs:
        if not n.any_learner(ctx, x["mask"].any()):  # every sample too stale to train on
            return {"actor_stats": {"skipped_datasets": 1.0}}
        p, slot = ctx.params, ctx.models["actor"]
        epochs = 1 if self.update.one_epoch else p.num_epochs
        keys = ("actions", "log_prob", "advantages", "mask") + self.update.extra_keys
        samples = minibatches(ctx, {"obs": x["obs"][:-1], **{key: x[key] for key in keys}}, epochs)
        totals, names, steps = n.sgd_steps(ctx, slot, self, samples, lambda mb, guard: self.step(ctx, mb, guard))
        return {"actor_stats": mean_stats(totals, steps, names)}

    def step(self, ctx: Context, mb: dict[str, torch.Tensor], guard: StepGuard) -> n.StepStats:
        p, slot = ctx.params, ctx.models["actor"]
        with n.step_autocast(slot, p.mixed_precision):
            dist_params = slot.module(mb["obs"])
        dist = slot.module.distribution(dist_params.float())
        log_prob = dist.log_prob(mb["actions"])
        entropy = ppo.weighted_mean(dist.entropy(), mb["weights"])
        if p.normalize_advantage:
            mb["advantages"] = n.normalized_advantages(mb["advantages"], mb["weights"])
        policy_loss, extra = self.update.policy_loss(ctx, dist, log_prob, mb)
        loss = policy_loss - p.exploration_loss_coeff * entropy
        grad_norm = n.optimizer_step(ctx, slot, loss, {"policy loss": policy_loss, "entropy": entropy}, guard)
        kl, clip_fraction = n.policy_change(log_prob, mb["log_prob"], mb["weights"], p.ppo_clip_ratio)
        with torch.no_grad():
            values = torch.stack([policy_loss, entropy, kl, clip_fraction, grad_norm, *extra.values()])
        return values, ("policy_loss", "entropy", "kl", "clip_fraction", "actor_grad_norm") + tuple(extra)


@dataclass(frozen=True)
class CriticUpdate:
    """The critic's train_step: value_loss_coeff · the value loss (clipped around the values the samples were
    collected with, --ppo_clip_value), in normalized units, for the epochs of the update it replaces."""

    one_epoch: bool = False

    def __call__(self, ctx: Context, x: Inputs) -> Inputs:
        if not n.any_learner(ctx, x["mask"].any()):
            return {"critic_stats": {"skipped_datasets": 1.0}}
        return {"critic_stats": fit_critic(ctx, x, 1 if self.one_epoch else ctx.params.num_epochs)}


def fit_critic(ctx: Context, x: Inputs, epochs: int) -> dict[str, float]:
    """The dataset's value targets into the returns normalisation, then `epochs` passes of minibatch SGD."""
    p, slot = ctx.params, ctx.models["critic"]
    critic: Critic = slot.module
    mask = x["mask"]
    if critic.returns_norm is not None:
        critic.returns_norm.update(x["value_targets"][mask.bool()], ctx.gather)
    samples = {"obs": x["obs"][:-1], "targets": critic.normalize_value(x["value_targets"]),
               "old_values": critic.normalize_value(x["values"][:-1]), "mask": mask}

    def step(mb: dict[str, torch.Tensor], guard: StepGuard) -> n.StepStats:
        with n.step_autocast(slot, p.mixed_precision):
            values = critic(mb["obs"]).float()
        error = ppo.value_error(values, mb["old_values"], mb["targets"], p.ppo_clip_value)
        value_loss = ppo.weighted_mean(error, mb["weights"])
        grad_norm = n.optimizer_step(ctx, slot, p.value_loss_coeff * value_loss, {"value loss": value_loss}, guard)
        with torch.no_grad():
            return torch.stack([value_loss, grad_norm]), ("value_loss", "critic_grad_norm")

    totals, names, steps = n.sgd_steps(ctx, slot, "critic", minibatches(ctx, samples, epochs), step)
    stats = mean_stats(totals, steps, names)
    stats.update(value_mean=x["values"][:-1].mean().item(), target_mean=x["value_targets"].mean().item())
    return stats


# the graph ------------------------------------------------------------------------------------------------------
def split_actor_critic(algorithm: Algorithm) -> Algorithm:
    """`algorithm` with its minibatch SGD update of the actor-critic replaced by the three train_steps above."""
    updates = [node for node in algorithm.nodes if isinstance(node.fn, n.SGDUpdate) and node.model == WHOLE]
    if len(updates) != 1:
        raise ConfigError(f"--split_actor_critic: the algorithm must have one minibatch SGD update of the "
                          f"actor-critic to split, it has {len(updates)}")
    update = updates[0]
    common = ("mask", "obs", "obs_folded")
    algorithm.nodes = [node for node in algorithm.nodes if node is not update] + [
        Node("fold_obs_statistics", "train_step", ("obs", "inactive"), ("obs_folded",), fold_obs_statistics,
             model=WHOLE),
        Node("actor_update", "train_step", common + ("actions", "log_prob", "advantages") + update.fn.extra_keys,
             ("actor_stats",), ActorUpdate(update.fn), model="actor"),
        Node("critic_update", "train_step", common + ("values", "value_targets"), ("critic_stats",),
             CriticUpdate(update.fn.one_epoch), model="critic"),
    ]
    extra_models = algorithm.extra_models
    algorithm.extra_models = lambda models: {**extra_models(models), **split_models(models)}
    algorithm.parts = {"actor": WHOLE, "critic": WHOLE}
    algorithm.release_after = ("actor_update",)  # the critic trains on while the next dataset is collected
    return algorithm


@register_check
def check_split(cfg: Config) -> None:
    if cfg.split_actor_critic and (cfg.use_rnn or cfg.core_custom):
        raise ConfigError("--split_actor_critic=True trains feed-forward models only; a recurrent core "
                          "(--use_rnn, --core_custom) would need its state split between the actor and the critic "
                          "(an env's preset may set it: pass --split_actor_critic=False with a recurrent core)")
