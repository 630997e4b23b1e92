"""The node functions PPO, APPO and REINFORCE are built from, in the order they run.

Each takes (context, inputs) and returns its outputs; `sf_core.algo.algorithms` wires them into graphs.
Batch tensors are time-major: [T, N] per step, [T+1, N] for observations (last row: bootstrap).
  1. lag_mask          which samples are recent enough to train on (and real: not an inactive agent's)
  2. values            the behaviour policy's, or recomputed with the current model (and, for
                       V-trace, the current policy's log-probs)
  3. fold_truncation   a time-limit cut ends the trajectory but bootstraps from V(final obs)
  4. targets           GAE, V-trace, or Monte-Carlo returns (REINFORCE)
  5. update            minibatch SGD: PPO clipped surrogate, or the plain policy gradient
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from sf_core.algo import ppo
from sf_core.algo.gradient_clipping import clip_grad_norm
from sf_core.algo.graph import Context, ModelSlot
from sf_core.algo.graphed_sgd import StepStats, graphed_sgd, is_recording
from sf_core.algo.model import autocast
from sf_core.algo.non_finite import StepGuard
from sf_core.algo.targets import gae, vtrace

Inputs = dict[str, Any]


# 1. ------------------------------------------------------------------------------------------------
def lag_mask(ctx: Context, x: Inputs) -> Inputs:
    """Mask 1 for samples to train on: recent enough (--max_policy_lag) and taken by an agent that was
    acting (a multi-agent env's agent that finished early leaves `inactive` rows, which are no samples)."""
    lag = (ctx.policy_version - x["policy_version"]).float()
    recent = lag <= ctx.params.max_policy_lag
    active = ~x["inactive"]
    mask = (recent & active).float()
    samples = max(1, int(active.sum()))
    return {"mask": mask, "lag_stats": {
        "policy_lag_mean": lag[active].mean().item() if active.any() else 0.0,
        "policy_lag_max": lag[active].max().item() if active.any() else 0.0,
        "dropped_for_lag_fraction": float((active & ~recent).sum()) / samples,
        "inactive_fraction": 1.0 - active.float().mean().item()}}


# 2. ------------------------------------------------------------------------------------------------
def behaviour_values(ctx: Context, x: Inputs) -> Inputs:
    """The values inference computed while acting (row T: the bootstrap value), as PPO uses them."""
    return {"values": x["behaviour_values"]}


def recompute(ctx: Context, x: Inputs) -> Inputs:
    model = ctx.models["actor_critic"].module
    obs, actions = x["obs"], x["actions"]
    T, N = actions.shape[:2]
    with autocast(ctx.models["actor_critic"].device, ctx.params.mixed_precision):
        if model.recurrent:  # rows 0..T-1 as sequences, the bootstrap row T from its recorded state
            R = ctx.params.recurrence
            params, values_norm = model.sequence(to_chunks(obs[:-1], R), x["rnn_states"][0:T:R].flatten(0, 1),
                                                 to_chunks(step_resets(x["episode_ends"]), R))
            params, values_norm = from_chunks(params, T, N), from_chunks(values_norm, T, N)
            params_last, values_last, _ = model.step(obs[-1], x["rnn_states"][-1])
            dist_params = torch.cat([params, params_last.unsqueeze(0)])
            values_norm = torch.cat([values_norm, values_last.unsqueeze(0)])
        else:
            dist_params, values_norm = model(obs.flatten(0, 1))
    dist_params, values_norm = dist_params.float(), values_norm.float()
    values = model.denormalize_value(values_norm).view(T + 1, N)
    dist = model.distribution(dist_params.view(T + 1, N, -1)[:-1].flatten(0, 1))
    target_log_prob = dist.log_prob(actions.flatten(0, 1)).view(T, N)
    return {"values": values, "target_log_prob": target_log_prob}


def step_resets(episode_ends: torch.Tensor) -> torch.Tensor:
    """[T, N]: the recurrent state is zeroed before step t when an episode ended at step t-1."""
    return torch.cat([torch.zeros_like(episode_ends[:1]), episode_ends[:-1]]).bool()


def to_chunks(x: torch.Tensor, length: int) -> torch.Tensor:
    """[T, N, ...] -> [length, (T / length) * N, ...]: consecutive steps become sequences; sequence
    k * N + n is env n's steps k*length .. (k+1)*length - 1."""
    T, N = x.shape[:2]
    return x.reshape(T // length, length, N, *x.shape[2:]).transpose(0, 1).reshape(length, -1, *x.shape[2:])


def from_chunks(x: torch.Tensor, T: int, N: int) -> torch.Tensor:
    """Inverse of to_chunks."""
    length = x.shape[0]
    return x.reshape(length, T // length, N, *x.shape[2:]).transpose(0, 1).reshape(T, N, *x.shape[2:])


# 3. ------------------------------------------------------------------------------------------------
def fold_truncation(rewards_key: str) -> Callable[[Context, Inputs], Inputs]:
    def fold(ctx: Context, x: Inputs) -> Inputs:
        truncated = x["truncated"].float()
        shaped = x[rewards_key] + ctx.params.gamma * truncated * x["trunc_values"]
        return {"shaped_rewards": shaped, "episode_ends": (x["dones"] | x["truncated"]).float()}

    return fold


# 4. ------------------------------------------------------------------------------------------------
def gae_targets(ctx: Context, x: Inputs) -> Inputs:
    p = ctx.params
    advantages, targets = gae(x["shaped_rewards"], x["values"], x["episode_ends"], p.gamma, p.gae_lambda)
    return {"advantages": advantages, "value_targets": targets}


def vtrace_targets(ctx: Context, x: Inputs) -> Inputs:
    p = ctx.params
    advantages, targets = vtrace(x["shaped_rewards"], x["values"], x["episode_ends"],
                                 x["target_log_prob"] - x["log_prob"], p.gamma, p.gae_lambda, p.vtrace_rho, p.vtrace_c)
    return {"advantages": advantages, "value_targets": targets}


def monte_carlo_targets(ctx: Context, x: Inputs) -> Inputs:
    """REINFORCE: discounted returns to the end of the episode (λ = 1), bootstrapped only where a
    trajectory is cut; the advantage subtracts the learned baseline V(s)."""
    advantages, targets = gae(x["shaped_rewards"], x["values"], x["episode_ends"], ctx.params.gamma, 1.0)
    return {"advantages": advantages, "value_targets": targets}


# 5. ------------------------------------------------------------------------------------------------
# A policy loss: (context, the current policy's distribution, its log-probs of the actions, the minibatch)
# -> (loss, any extra statistics to report, by name). The minibatch's keys: "log_prob" (the behaviour policy's),
# "advantages" (normalized if --normalize_advantage), "actions", "mask" (1 for samples to train on), "weights"
# (the mask over its count: ppo.weighted_mean averages over the samples trained on), and the update's extra keys.
PolicyLoss = Callable[[Context, Any, torch.Tensor, dict], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def _ppo_policy_loss(ctx: Context, dist, log_prob, mb) -> tuple[torch.Tensor, dict]:
    objective = ppo.surrogate(log_prob, mb["log_prob"], mb["advantages"], ctx.params.ppo_clip_ratio)
    return -ppo.weighted_mean(objective, mb["weights"]), {}


def _pg_policy_loss(ctx: Context, dist, log_prob, mb) -> tuple[torch.Tensor, dict]:
    return -ppo.weighted_mean(log_prob * mb["advantages"], mb["weights"]), {}


@dataclass(frozen=True)
class SGDUpdate:
    """A train_step node's function: minibatch SGD on the actor-critic, whose loss is `policy_loss` plus the value
    loss and the entropy bonus. `one_epoch`: a single pass whatever --num_epochs says (REINFORCE);
    `extra_keys`: inputs the policy loss reads too."""

    policy_loss: PolicyLoss
    one_epoch: bool = False
    extra_keys: tuple[str, ...] = ()

    def __call__(self, ctx: Context, x: Inputs) -> Inputs:
        epochs = 1 if self.one_epoch else ctx.params.num_epochs
        return {"train_stats": minibatch_sgd(ctx, x, self.policy_loss, epochs, self.extra_keys)}


ppo_update = SGDUpdate(_ppo_policy_loss)
policy_gradient_update = SGDUpdate(_pg_policy_loss, one_epoch=True)  # no ratio clipping: REINFORCE's −log π(a|s)·A


def minibatch_sgd(ctx: Context, x: Inputs, policy_loss_fn: PolicyLoss, epochs: int,
                  extra_keys: tuple[str, ...] = ()) -> dict[str, float]:
    """Minibatches of whole sequences of --recurrence steps (of single samples for a feed-forward
    model: sequences of length 1), each unrolled from the recurrent state recorded while acting.
    `extra_keys`: [T, N, ...] inputs the policy loss reads too (a teacher's action distribution)."""
    p, slot = ctx.params, ctx.models["actor_critic"]
    model = slot.module
    T, N = x["actions"].shape[:2]
    mask = x["mask"]
    obs = x["obs"][:-1].flatten(0, 1)
    if x["inactive"].any():  # only observations agents acted on (an inactive agent's row holds zeros);
        obs = obs[~x["inactive"].flatten()]  # no copy of every frame when all acted
    model.update_obs_stats(obs, ctx.gather)
    if not any_learner(ctx, mask.any()):  # every sample too stale to train on (--max_policy_lag)
        return {"skipped_datasets": 1.0}
    if model.returns_norm is not None:
        model.returns_norm.update(x["value_targets"][mask.bool()], ctx.gather)
    R = p.recurrence if model.recurrent else 1
    sequences = {key: to_chunks(value, R) for key, value in {
        "obs": x["obs"][:-1], "actions": x["actions"], "log_prob": x["log_prob"], "advantages": x["advantages"],
        "targets": model.normalize_value(x["value_targets"]), "old_values": model.normalize_value(x["values"][:-1]),
        "mask": mask, "resets": step_resets(x["episode_ends"]), **{key: x[key] for key in extra_keys},
    }.items()}
    # [1, sequences, S]: gathered along the sequences' dim with the rest
    sequences["initial_states"] = x["rnn_states"][0:T:R].flatten(0, 1)[None]
    minibatches = ({**mb, "initial_states": mb["initial_states"][0]}
                   for mb in epoch_minibatches(ctx, sequences, p.batch_size // R, epochs))
    totals, names, steps = sgd_steps(ctx, slot, policy_loss_fn, minibatches,
                                     lambda mb, guard: _sgd_step(ctx, mb, policy_loss_fn, guard))
    stats = dict(zip(names, (totals / max(1, steps)).tolist())) if totals is not None else {}
    stats.update(value_mean=x["values"][:-1].mean().item(), target_mean=x["value_targets"].mean().item())
    return stats


def sgd_steps(ctx: Context, slot: ModelSlot, key: Any, minibatches: Iterable[dict[str, torch.Tensor]],
              step: Callable[[dict[str, torch.Tensor], StepGuard], StepStats]
              ) -> tuple[torch.Tensor | None, tuple[str, ...], int]:
    """`step(mb, guard)` on each minibatch, one dataset's SGD steps of `slot`'s model, replayed from a CUDA graph
    where --sgd_cuda_graphs records them (algo/graphed_sgd.py; `key` names the update); returns the statistics
    summed on the model's device (read once: a read per step would make a GPU wait for every step), their
    names and the number of steps. Raises after the last step if one was not finite."""
    graphed = graphed_sgd(slot, key, ctx.params.sgd_cuda_graphs, ctx.gather, ctx.finite_check_on_device)
    guard = step_guard(ctx, slot) if graphed is None else graphed.begin(ctx.params)

    def run(mb: dict[str, torch.Tensor]) -> StepStats:
        return step(mb, guard)

    totals, names, steps = None, (), 0
    for mb in minibatches:
        stats, names = run(mb) if graphed is None else graphed.step(mb, run)
        totals, steps = stats if totals is None else totals + stats, steps + 1
        ctx.on_minibatch()
    guard.finish()
    return totals, names, steps


def epoch_minibatches(ctx: Context, tensors: dict[str, torch.Tensor], size: int, epochs: int,
                      dim: int = 1) -> Iterator[dict[str, torch.Tensor]]:
    """`epochs` passes over the samples along `dim`, each in a new order, as minibatches of `size`. Each epoch
    gathers every tensor once in its order and cuts the minibatches as slices: the same samples as a gather per
    minibatch, with an eighth of the gathers at 8 minibatches an epoch (on small models a gather's cost is its
    per-call overhead)."""
    first = next(iter(tensors.values()))
    count = first.shape[dim]
    for _ in range(epochs):
        order = minibatch_order(ctx, count, first.device)
        shuffled = {key: value.index_select(dim, order) for key, value in tensors.items()}
        for start in range(0, count, size):
            yield {key: value.narrow(dim, start, min(size, count - start)) for key, value in shuffled.items()}


def minibatch_order(ctx: Context, count: int, device: torch.device) -> torch.Tensor:
    """The order of one epoch's `count` samples (or sequences): shuffled from the call's own generator with
    --shuffle_minibatches, else as stored. On the model's device: a host-side index would be copied over for
    every minibatch."""
    if not ctx.params.shuffle_minibatches:
        return torch.arange(count, device=device)
    return torch.randperm(count, device=device, generator=ctx.generator)


def any_learner(ctx: Context, flag: torch.Tensor) -> bool:
    """`flag` here, or on any rank of a learner group: every rank must take the same branch, since each
    SGD step waits for the others' gradients."""
    if ctx.gather is None:
        return bool(flag)
    return any(bool(f) for f in ctx.gather(flag.float().reshape(1)))


STEP_STATS = ("loss", "policy_loss", "value_loss", "entropy", "kl", "clip_fraction", "grad_norm")


def _sgd_step(ctx: Context, mb: dict[str, torch.Tensor], policy_loss_fn: PolicyLoss, guard: StepGuard | None = None
              ) -> tuple[torch.Tensor, tuple[str, ...]]:
    """One optimizer step on minibatch `mb`; returns its STEP_STATS and the policy loss's extra statistics as
    one tensor on the model's device, and their names. `guard`: the dataset's (None: this step is one)."""
    p, slot = ctx.params, ctx.models["actor_critic"]
    model = slot.module
    with step_autocast(slot, p.mixed_precision):
        dist_params, values = model.sequence(mb.pop("obs"), mb.pop("initial_states"), mb.pop("resets"))
    # losses in float32, over [sequence length × sequences] flattened
    dist_params, values = dist_params.float().flatten(0, 1), values.float().flatten(0, 1)
    mb = {key: value.flatten(0, 1) for key, value in mb.items()}
    weights = mb["weights"] = mb["mask"] / mb["mask"].sum().clamp_min(1.0)
    dist = model.distribution(dist_params)
    log_prob = dist.log_prob(mb["actions"])
    entropy = ppo.weighted_mean(dist.entropy(), weights)
    if p.normalize_advantage:
        mb["advantages"] = normalized_advantages(mb["advantages"], weights)

    policy_loss, extra = policy_loss_fn(ctx, dist, log_prob, mb)
    value_loss = ppo.weighted_mean(ppo.value_error(values, mb["old_values"], mb["targets"], p.ppo_clip_value),
                                   weights)
    loss = policy_loss + p.value_loss_coeff * value_loss - p.exploration_loss_coeff * entropy
    terms = {"policy loss": policy_loss, "value loss": value_loss, "entropy": entropy}
    alone = guard is None  # a step on its own: its own guard, read at once
    guard = step_guard(ctx, slot) if guard is None else guard
    grad_norm = optimizer_step(ctx, slot, loss, terms, guard)
    if alone:
        guard.finish()
    kl, clip_fraction = policy_change(log_prob, mb["log_prob"], weights, p.ppo_clip_ratio)
    with torch.no_grad():
        values = [loss, policy_loss, value_loss, entropy, kl, clip_fraction, grad_norm, *extra.values()]
        return torch.stack(values).float(), STEP_STATS + tuple(extra)


def step_autocast(slot: ModelSlot, mixed_precision: bool):
    """--mixed_precision's autocast for a model call of an SGD step: without its cache while the step is recorded
    as a CUDA graph, which must not keep autocast's cast weights beyond the recording."""
    return autocast(slot.device, mixed_precision, cache=not (mixed_precision and is_recording(slot.device)))


def normalized_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Advantages with zero mean and unit std over the samples actually trained on (--normalize_advantage)."""
    mean = ppo.weighted_mean(advantages, weights)
    std = ppo.weighted_mean((advantages - mean).pow(2), weights).sqrt()
    return (advantages - mean) / (std + 1e-8)


def step_guard(ctx: Context, slot: ModelSlot) -> StepGuard:
    """The guard of one dataset's steps of `slot`'s optimizer: `finish()` it after the last step."""
    return StepGuard(slot.optimizer, slot.device, ctx.finite_check_on_device)


def optimizer_step(ctx: Context, slot: ModelSlot, loss: torch.Tensor, terms: dict[str, torch.Tensor],
                   guard: StepGuard) -> torch.Tensor:
    """Backward, the gradients averaged over a learner group and clipped to --max_grad_norm, then the optimizer's
    step unless a gradient is not finite (`guard`'s check; `terms`, the loss's parts, name the culprit);
    returns the gradients' norm before clipping."""
    parameters = slot.parameters
    slot.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    ctx.average_gradients(parameters)  # a learner group: every rank steps with the mean gradient
    max_norm = ctx.params.max_grad_norm if ctx.params.max_grad_norm > 0 else float("inf")
    grad_norm = clip_grad_norm(parameters, max_norm)
    # checked after the averaging: a learner group's ranks share the averaged gradients, so all stop together
    guard.step(grad_norm, terms)
    return grad_norm


@torch.no_grad()
def policy_change(log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor, weights: torch.Tensor,
                  clip_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The KL estimate from the behaviour policy, and the share of samples whose ratio left the clip range."""
    log_ratio = log_prob - behaviour_log_prob
    kl = ppo.weighted_mean(ppo.kl_estimate(log_ratio), weights)
    return kl, ppo.weighted_mean((log_ratio.exp() - 1).abs().gt(clip_ratio).float(), weights)
