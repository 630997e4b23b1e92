"""Per-env defaults (RL-Zoo style): applied under the user's flags, never over them.

A preset is keyed by env id; the console says which preset was applied. Values here come from
tuning runs listed in docs/flags.md (results in docs/results.md).
"""

from __future__ import annotations

from typing import Any

# Classic-control envs: tiny observations, fast steps. Short rollouts and small datasets give many
# quick updates, which is what solves these envs sooner in wall-clock time.
_CLASSIC_DISCRETE: dict[str, Any] = {
    "num_envs_per_worker": 64,  # big env groups: fewer, larger inference batches (docs/performance.md)
    "rollout": 32,
    "batch_size": 1024,
    "num_batches_per_epoch": 2,
    "num_epochs": 2,
    "learning_rate": 3e-4,
    "gamma": 0.99,
    "exploration_loss_coeff": 0.003,
    "encoder_mlp_layers": [64, 64],
    "ppo_clip_ratio": 0.2,
    "train_for_env_steps": 500_000,
}

_PENDULUM: dict[str, Any] = {
    "num_envs_per_worker": 16,
    "rollout": 64,
    "batch_size": 1024,
    "num_batches_per_epoch": 4,
    "num_epochs": 6,
    "learning_rate": 1e-3,
    "gamma": 0.95,
    "gae_lambda": 0.95,
    "exploration_loss_coeff": 0.0,
    "encoder_mlp_layers": [64, 64],
    "nonlinearity": "tanh",
    "ppo_clip_ratio": 0.2,
    "reward_scale": 0.1,
    "train_for_env_steps": 500_000,
}

PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": _CLASSIC_DISCRETE,
    "Acrobot-v1": _CLASSIC_DISCRETE,
    "Pendulum-v1": _PENDULUM,
}


def preset_for(env: str) -> tuple[str | None, dict[str, Any]]:
    """The preset for `env` (name, values), or (None, {})."""
    if env in PRESETS:
        return env, dict(PRESETS[env])
    return None, {}
