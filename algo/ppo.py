"""PPO loss terms: clipped surrogate, (optionally clipped) value loss, entropy bonus."""

from __future__ import annotations

import torch


def policy_loss(log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor, advantages: torch.Tensor,
                clip_ratio: float, mask: torch.Tensor) -> torch.Tensor:
    ratio = (log_prob - behaviour_log_prob).exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio) * advantages
    return -masked_mean(torch.min(unclipped, clipped), mask)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, targets: torch.Tensor, clip: float,
               mask: torch.Tensor) -> torch.Tensor:
    loss = (values - targets).pow(2)
    if clip > 0:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.max(loss, (clipped - targets).pow(2))
    return 0.5 * masked_mean(loss, mask)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def approx_kl(log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(μ‖π) estimate (Schulman's k3), cheap and always ≥ 0."""
    log_ratio = log_prob - behaviour_log_prob
    return masked_mean(log_ratio.exp() - 1.0 - log_ratio, mask)
