"""Hyperparameters the algorithm graphs' nodes read (a typed subset of the config)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LearningParams:
    gamma: float = 0.99
    gae_lambda: float = 0.95
    with_vtrace: bool = False
    recompute_values: bool = False
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
    mixed_precision: bool = False
    recurrence: int = 1  # sequence length the learner unrolls (1: samples are independent)

    @classmethod
    def from_config(cls, cfg) -> "LearningParams":
        fields = {name: getattr(cfg, name) for name in cls.__dataclass_fields__ if name != "recurrence"}
        return cls(**fields, recurrence=cfg.recurrence_length())
