"""The model-related flags as a typed view, so a model does not depend on the whole config (defaults:
Config's, written once there)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from sf_core.algo import custom_models
from sf_core.config import Config, default


@dataclass(frozen=True)
class ModelSpec:
    """The model-related flags, so the model does not depend on the whole config (defaults: Config's)."""

    encoder_mlp_layers: tuple[int, ...] = tuple(default("encoder_mlp_layers"))
    critic_mlp_layers: tuple[int, ...] = tuple(default("critic_mlp_layers"))  # empty: encoder_mlp_layers
    nonlinearity: str = default("nonlinearity")
    share_weights: bool = default("actor_critic_share_weights")
    normalize_input: bool = default("normalize_input")
    normalize_returns: bool = default("normalize_returns")
    continuous_tanh_scale: float = default("continuous_tanh_scale")
    initial_log_std: float = default("initial_log_std")
    encoder_conv_architecture: str = default("encoder_conv_architecture")
    encoder_conv_mlp_layers: tuple[int, ...] = tuple(default("encoder_conv_mlp_layers"))
    use_rnn: bool = default("use_rnn")
    rnn_type: str = default("rnn_type")
    rnn_size: int = default("rnn_size")
    decoder_mlp_layers: tuple[int, ...] = tuple(default("decoder_mlp_layers"))
    # registered factories (sf_core.algo.custom_models), resolved where the flags are parsed
    encoder_factory: Callable | None = None
    core_factory: Callable | None = None
    decoder_factory: Callable | None = None

    @classmethod
    def from_config(cls, cfg: Config) -> "ModelSpec":
        return cls(
            encoder_mlp_layers=tuple(cfg.encoder_mlp_layers), critic_mlp_layers=tuple(cfg.critic_mlp_layers),
            nonlinearity=cfg.nonlinearity,
            share_weights=cfg.actor_critic_share_weights and not cfg.split_actor_critic,  # a half per model
            normalize_input=cfg.normalize_input,
            normalize_returns=cfg.normalize_returns, continuous_tanh_scale=cfg.continuous_tanh_scale,
            initial_log_std=cfg.initial_log_std, encoder_conv_architecture=cfg.encoder_conv_architecture,
            encoder_conv_mlp_layers=tuple(cfg.encoder_conv_mlp_layers), use_rnn=cfg.use_rnn,
            rnn_type=cfg.rnn_type, rnn_size=cfg.rnn_size, decoder_mlp_layers=tuple(cfg.decoder_mlp_layers),
            encoder_factory=custom_models.resolve("encoder", cfg.encoder_custom),
            core_factory=custom_models.resolve("core", cfg.core_custom),
            decoder_factory=custom_models.resolve("decoder", cfg.decoder_custom))

    def for_critic(self) -> "ModelSpec":
        """The spec of the critic's own body: its MLP encoder sized by --critic_mlp_layers where given."""
        if not self.critic_mlp_layers:
            return self
        return dataclasses.replace(self, encoder_mlp_layers=self.critic_mlp_layers)
