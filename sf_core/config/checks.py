"""The checks of the engine's own flags, registered first: ranges, divisibility, recurrence, policies. Each
feature registers the checks of its own flags where it lives (sf_core/cli/arguments.py, FLAG_CHECKS)."""

from __future__ import annotations

import dataclasses
import math

from sf_core.config.schema import Config, ConfigError, register_check

POSITIVE = ("num_workers", "num_envs_per_worker", "worker_num_splits", "policy_workers_per_policy", "num_policies",
            "num_learners", "rollout", "batch_size", "num_batches_per_epoch", "num_epochs", "torch_threads",
            "stats_window", "env_frameskip", "keep_checkpoints", "eval_episodes")
POSITIVE_NUMBERS = ("learning_rate", "train_for_seconds", "heartbeat_timeout", "report_interval",
                    "experiment_summaries_interval", "save_every_sec", "env_service_timeout",
                    "env_service_recheck_interval", "env_service_down_timeout", "worker_replacement_window")


@register_check
def check_ranges(cfg: Config) -> None:
    if not cfg.env:
        raise ConfigError("--env is required (a registered env name or a gymnasium id such as CartPole-v1)")
    for name in POSITIVE:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name} must be at least 1, got {getattr(cfg, name)}")
    for name in POSITIVE_NUMBERS:
        value = getattr(cfg, name)
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"--{name} must be a positive number, got {value}")
    for name in ("max_policy_lag", "max_recoveries", "max_worker_replacements", "num_batches_to_accumulate",
                 "learner_torch_threads"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"--{name} must be at least 0, got {getattr(cfg, name)}")
    if cfg.eval_every_env_steps < 0:
        raise ConfigError(f"--eval_every_env_steps must be at least 0 (0: no evaluation), got "
                          f"{cfg.eval_every_env_steps}")
    if cfg.train_for_env_steps < 1:
        raise ConfigError(f"--train_for_env_steps must be at least 1, got {cfg.train_for_env_steps}")
    for name in ("gamma", "gae_lambda", "repeat_action_probability"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ConfigError(f"--{name} must be in [0, 1], got {getattr(cfg, name)}")
    for name in ("encoder_mlp_layers", "encoder_conv_mlp_layers", "decoder_mlp_layers", "critic_mlp_layers"):
        if any(size < 1 for size in getattr(cfg, name)):
            raise ConfigError(f"--{name} must be positive sizes, got {getattr(cfg, name)}")
    if cfg.critic_mlp_layers and cfg.actor_critic_share_weights and not cfg.split_actor_critic:
        raise ConfigError("--critic_mlp_layers sizes the critic's own body, and here actor and critic share one: "
                          "add --actor_critic_share_weights=False or --split_actor_critic=True")


@register_check
def check_shapes(cfg: Config) -> None:
    if cfg.num_envs_per_worker % cfg.worker_num_splits != 0:
        raise ConfigError(f"--num_envs_per_worker={cfg.num_envs_per_worker} must be divisible by "
                          f"--worker_num_splits={cfg.worker_num_splits} (each split steps the same number of envs)")
    if cfg.dataset_size() % cfg.rollout != 0:
        raise ConfigError(f"--batch_size × --num_batches_per_epoch = {cfg.batch_size} × {cfg.num_batches_per_epoch} = "
                          f"{cfg.dataset_size()} samples must be divisible by --rollout={cfg.rollout} "
                          f"(the learner trains on whole trajectories)")
    if cfg.recurrence == 0 or cfg.recurrence < -1:
        raise ConfigError(f"--recurrence must be -1 (automatic) or at least 1, got {cfg.recurrence}")
    if cfg.rnn_size < 1:
        raise ConfigError(f"--rnn_size must be at least 1, got {cfg.rnn_size}")
    length = cfg.recurrence_length()
    if cfg.rollout % length or cfg.batch_size % length:
        raise ConfigError(f"--recurrence={length} must divide --rollout={cfg.rollout} and --batch_size="
                          f"{cfg.batch_size}: the learner trains on whole sequences of that length")


@register_check
def check_policies(cfg: Config) -> None:
    for k, values in cfg.policy_overrides().items():
        policy = dataclasses.replace(cfg, **values)
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(policy, name) <= 1.0:
                raise ConfigError(f"--policy_hyperparams: policy {k}'s {name} must be in [0, 1], got "
                                  f"{getattr(policy, name)}")
        if not policy.learning_rate > 0:
            raise ConfigError(f"--policy_hyperparams: policy {k}'s learning_rate must be positive, got "
                              f"{policy.learning_rate}")
    if cfg.num_policies > 1 and not cfg.async_rl:
        raise ConfigError("--async_rl=False trains one policy: with several, a trajectory slot holds rows of "
                          "several policies and cannot wait for all of their learners; use --async_rl=True")
    if cfg.num_policies > 1 and cfg.datasets_ahead():
        raise ConfigError("--num_batches_to_accumulate trains one policy: with several, a trajectory slot holds "
                          "rows of several policies and cannot wait for all of their learners; leave it at 0")


@register_check
def check_inference_in_rollout_workers(cfg: Config) -> None:
    if not cfg.inference_in_rollout_workers:
        return
    if cfg.num_policies > 1:
        raise ConfigError("--inference_in_rollout_workers runs one policy in each rollout worker; with "
                          f"--num_policies={cfg.num_policies} pass --inference_in_rollout_workers=False (a preset "
                          "may set it) for inference workers")
    if cfg.ray_address:
        raise ConfigError("--inference_in_rollout_workers is for one machine; with --ray_address pass "
                          "--inference_in_rollout_workers=False (a preset may set it)")
