"""PPO loss terms: clipped surrogate, (optionally clipped) value loss, entropy bonus.

Each term is computed per sample and then averaged over the samples trained on. The learner's own step averages
with `weighted_mean` and sample weights it computes once per minibatch (the mask over its count): on the small
models of continuous control an SGD step's cost is nearly all per-operation overhead, and `masked_mean`'s
division by the mask's sum, forward and backward, was paid by every term of every step."""

from __future__ import annotations

import torch


def surrogate(log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor, advantages: torch.Tensor,
              clip_ratio: float) -> torch.Tensor:
    """PPO's clipped surrogate objective, per sample (to be maximized): the smaller of ratio·A and clip(ratio)·A.

    Where the clipped term is strictly smaller, the ratio lies outside the clip range and that term's gradient is
    zero; so it is taken without gradient, which gives the same gradient as torch.min's with fewer backward
    operations (min's and clamp's)."""
    ratio = (log_prob - behaviour_log_prob).exp()
    unclipped = ratio * advantages
    with torch.no_grad():
        clipped = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio) * advantages
    return torch.where(clipped < unclipped, clipped, unclipped)


def value_error(values: torch.Tensor, old_values: torch.Tensor, targets: torch.Tensor, clip: float) -> torch.Tensor:
    """Half the squared error per sample; with `clip` > 0, the larger of it and the error of a value kept within
    `clip` of the one the samples were collected with. That error, where strictly larger, comes from a value
    outside the range and has no gradient (as in `surrogate`): the value is clamped to the range itself, so one
    inside it is kept exactly (old + (value - old) may round to another number, whose error could win)."""
    error = (values - targets).pow(2)
    if clip > 0:
        with torch.no_grad():
            clipped_error = (values.clamp(old_values - clip, old_values + clip) - targets).pow(2)
        error = torch.where(clipped_error > error, clipped_error, error)
    return 0.5 * error


def kl_estimate(log_ratio: torch.Tensor) -> torch.Tensor:
    """KL(μ‖π) per sample from log π/μ (Schulman's k3), cheap and always ≥ 0."""
    return log_ratio.exp() - 1.0 - log_ratio


def weighted_mean(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The mean over the samples trained on, when `weights` is their mask over its count (a minibatch's
    "weights")."""
    return (x * weights).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def policy_loss(log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor, advantages: torch.Tensor,
                clip_ratio: float, mask: torch.Tensor) -> torch.Tensor:
    return -masked_mean(surrogate(log_prob, behaviour_log_prob, advantages, clip_ratio), mask)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, targets: torch.Tensor, clip: float,
               mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(value_error(values, old_values, targets, clip), mask)


def approx_kl(log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(μ‖π) estimate (Schulman's k3), cheap and always ≥ 0."""
    return masked_mean(kl_estimate(log_prob - behaviour_log_prob), mask)
