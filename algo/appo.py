"""APPO, one training iteration at a time, read top to bottom.

Input: a dataset of N trajectories of T steps, time-major ([T, N] or [T+1, N] for observations),
collected by possibly older policies (their versions are in `policy_version`).
  1. update observation statistics; recompute values (and, for V-trace, log-probs) with the
     current model;
  2. fold truncation into rewards: a time-limit cut bootstraps from the value of the final state;
  3. targets: GAE, or V-trace when correcting for policy lag;
  4. num_epochs passes of minibatch SGD on the PPO loss (clipped surrogate + value + entropy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from algo import ppo
from algo.model import ActorCritic
from algo.targets import gae, vtrace


@dataclass
class APPOParams:
    gamma: float = 0.99
    gae_lambda: float = 0.95
    with_vtrace: bool = False
    vtrace_rho: float = 1.0
    vtrace_c: float = 1.0
    ppo_clip_ratio: float = 0.1
    ppo_clip_value: float = 1.0
    value_loss_coeff: float = 0.5
    exploration_loss_coeff: float = 0.003
    max_grad_norm: float = 4.0
    normalize_advantage: bool = True
    max_policy_lag: int = 1000
    num_epochs: int = 1
    batch_size: int = 1024
    shuffle_minibatches: bool = True

    @classmethod
    def from_config(cls, cfg) -> "APPOParams":
        return cls(**{name: getattr(cfg, name) for name in cls.__dataclass_fields__})


class APPO:
    def __init__(self, model: ActorCritic, optimizer: torch.optim.Optimizer, params: APPOParams,
                 on_minibatch: Callable[[], None] = lambda: None):
        self.model, self.optimizer, self.p = model, optimizer, params
        self.on_minibatch = on_minibatch  # lets the learner keep its heartbeat going through long iterations

    def train(self, data: dict[str, torch.Tensor], policy_version: int) -> dict[str, float]:
        p, model = self.p, self.model
        T, N = data["rewards"].shape
        lag = (policy_version - data["policy_version"]).float()
        mask = (lag <= p.max_policy_lag).float()

        # 1. statistics and values under the current model
        if model.obs_norm is not None:
            model.obs_norm.update(data["obs"][:-1].flatten(0, 1).float())
        with torch.no_grad():
            dist_params, values_norm = model(data["obs"].flatten(0, 1))
            values = model.denormalize_value(values_norm).view(T + 1, N)
            target_log_prob = model.distribution(dist_params.view(T + 1, N, -1)[:-1].flatten(0, 1)) \
                .log_prob(data["actions"].flatten(0, 1)).view(T, N)

        # 2. rewards: a truncated step ends the trajectory but bootstraps from V(final obs)
        truncated = data["truncated"].float()
        rewards = data["rewards"] + p.gamma * truncated * data["trunc_values"]
        dones = (data["dones"] | data["truncated"]).float()

        # 3. targets
        if p.with_vtrace:
            advantages, targets = vtrace(rewards, values, dones, target_log_prob - data["log_prob"],
                                         p.gamma, p.gae_lambda, p.vtrace_rho, p.vtrace_c)
        else:
            advantages, targets = gae(rewards, values, dones, p.gamma, p.gae_lambda)
        if model.returns_norm is not None:
            model.returns_norm.update(targets[mask.bool()])
        targets_norm = model.normalize_value(targets)
        old_values_norm = model.normalize_value(values[:-1])

        # 4. minibatch SGD on flattened samples
        flat = {
            "obs": data["obs"][:-1].flatten(0, 1), "actions": data["actions"].flatten(0, 1),
            "log_prob": data["log_prob"].flatten(0, 1), "advantages": advantages.flatten(),
            "targets": targets_norm.flatten(), "old_values": old_values_norm.flatten(), "mask": mask.flatten(),
        }
        stats = _Accumulator()
        for _ in range(p.num_epochs):
            order = torch.randperm(T * N) if p.shuffle_minibatches else torch.arange(T * N)
            for start in range(0, T * N, p.batch_size):
                idx = order[start:start + p.batch_size]
                stats.add(self._sgd_step({k: v[idx] for k, v in flat.items()}))
                self.on_minibatch()

        result = stats.mean()
        result.update(policy_lag_mean=lag.mean().item(), policy_lag_max=lag.max().item(),
                      value_mean=values[:-1].mean().item(), target_mean=targets.mean().item(),
                      dropped_for_lag_fraction=1.0 - mask.mean().item())
        return result

    def _sgd_step(self, mb: dict[str, torch.Tensor]) -> dict[str, float]:
        p, model = self.p, self.model
        dist_params, values = model(mb["obs"])
        dist = model.distribution(dist_params)
        log_prob = dist.log_prob(mb["actions"])
        entropy = ppo.masked_mean(dist.entropy(), mb["mask"])

        advantages = mb["advantages"]
        if p.normalize_advantage:
            advantages = (advantages - advantages.mean()) / (advantages.std(unbiased=False) + 1e-8)

        policy_loss = ppo.policy_loss(log_prob, mb["log_prob"], advantages, p.ppo_clip_ratio, mb["mask"])
        value_loss = ppo.value_loss(values, mb["old_values"], mb["targets"], p.ppo_clip_value, mb["mask"])
        loss = policy_loss + p.value_loss_coeff * value_loss - p.exploration_loss_coeff * entropy
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite loss (policy {policy_loss.item()}, value {value_loss.item()}, entropy {entropy.item()}); "
                f"check the env's observations and rewards for NaN/inf"
            )

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = p.max_grad_norm if p.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        self.optimizer.step()

        with torch.no_grad():
            kl = ppo.approx_kl(log_prob, mb["log_prob"], mb["mask"])
            clip_fraction = ppo.masked_mean(((log_prob - mb["log_prob"]).exp() - 1).abs().gt(p.ppo_clip_ratio).float(),
                                            mb["mask"])
        return {"loss": loss.item(), "policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                "entropy": entropy.item(), "kl": kl.item(), "clip_fraction": clip_fraction.item(),
                "grad_norm": float(grad_norm)}


class _Accumulator:
    def __init__(self):
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.count += 1

    def mean(self) -> dict[str, float]:
        return {key: value / max(1, self.count) for key, value in self.sums.items()}
