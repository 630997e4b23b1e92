"""Hyperparameters the algorithm builders and graph nodes read: a typed subset of the config."""

from __future__ import annotations

from dataclasses import dataclass, fields

from sf_core.config import Config, default


@dataclass(frozen=True)
class LearningParams:
    gamma: float = default("gamma")
    gae_lambda: float = default("gae_lambda")
    with_vtrace: bool = default("with_vtrace")
    recompute_values: bool = default("recompute_values")
    vtrace_rho: float = default("vtrace_rho")
    vtrace_c: float = default("vtrace_c")
    ppo_clip_ratio: float = default("ppo_clip_ratio")
    ppo_clip_value: float = default("ppo_clip_value")
    value_loss_coeff: float = default("value_loss_coeff")
    exploration_loss_coeff: float = default("exploration_loss_coeff")
    max_grad_norm: float = default("max_grad_norm")
    normalize_advantage: bool = default("normalize_advantage")
    max_policy_lag: int = default("max_policy_lag")
    rnd_int_coeff: float = default("rnd_int_coeff")
    rnd_ext_coeff: float = default("rnd_ext_coeff")
    rnd_gamma: float = default("rnd_gamma")
    rnd_update_proportion: float = default("rnd_update_proportion")
    rnd_learning_rate: float = default("rnd_learning_rate")
    rnd_hidden: int = default("rnd_hidden")
    num_epochs: int = default("num_epochs")
    batch_size: int = default("batch_size")
    shuffle_minibatches: bool = default("shuffle_minibatches")
    mixed_precision: bool = default("mixed_precision")
    sgd_cuda_graphs: bool = default("sgd_cuda_graphs")
    teacher: str = default("teacher")
    teacher_kl_coeff: float = default("teacher_kl_coeff")
    split_actor_critic: bool = default("split_actor_critic")
    recurrence: int = 1  # steps the learner unrolls per sequence, resolved (Config.recurrence_length)

    @classmethod
    def from_config(cls, cfg: Config) -> "LearningParams":
        values = {f.name: getattr(cfg, f.name) for f in fields(cls) if f.name != "recurrence"}
        return cls(**values, recurrence=cfg.recurrence_length())
