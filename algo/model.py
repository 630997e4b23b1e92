"""Actor-critic model: observation -> preprocessing -> encoder -> [core] -> [decoder] -> heads.

The parts (see `sf_core.algo.encoders`, `sf_core.algo.core`, and `sf_core.algo.custom_models` for your own):
  preprocessing  unpack structured observations, scale images, normalize (shared by actor and critic)
  encoder        conv trunk per image field + MLP over vector fields
  core           optional GRU/LSTM (`--use_rnn`); its state is kept per env in shared memory
  decoder        optional MLP after the core (`--decoder_mlp_layers`)
  heads          action distribution parameters; value
With `--actor_critic_share_weights=False` the critic has its own encoder, core and decoder.

Values are predicted in units normalized by running return statistics when `normalize_returns`
is on; `value()` always returns them in reward units.

Calling conventions: `step(obs, state)` for one time step of a batch of envs (inference),
`sequence(obs, state, resets)` for [L, B] sequences (the learner; L = 1 for a feed-forward model),
and `model(obs)` as a shortcut for feed-forward models.
"""

from __future__ import annotations

import contextlib

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from sf_core.algo.core import RecurrentCore
from sf_core.algo.distributions import ActionDistribution, make_action_head
from sf_core.algo.encoders import ObservationEncoder, ObsPreprocessor
from sf_core.algo.mlp import mlp
from sf_core.algo.model_spec import ModelSpec
from sf_core.algo.normalization import Gather, RunningMeanStd
from sf_core.algo.observations import is_structured


def autocast(device, mixed_precision: bool, cache: bool = True):
    """bfloat16 autocast for model calls when --mixed_precision (a no-op context otherwise); callers
    convert what comes out back with .float() before losses and sampling. `cache=False` inside a CUDA
    graph's capture, which must not keep autocast's cast weights beyond it."""
    if not mixed_precision:  # a disabled torch.autocast still costs time per use, on every inference call
        return contextlib.nullcontext()
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    return torch.autocast(device_type, dtype=torch.bfloat16, cache_enabled=cache)


def has_fast_bfloat16(device) -> bool:
    """Whether `device` computes bfloat16 in hardware (CPUs with AMX or AVX512-BF16, GPUs from
    compute capability 8.0), where --mixed_precision pays off; elsewhere bf16 is emulated and slower."""
    if str(device).startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.get_device_capability(torch.device(device))[0] >= 8
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def store_weights_in_bfloat16(model: nn.Module) -> None:
    """For a model that only runs under `autocast`: keep the weights of the layers autocast computes
    in bfloat16 (linear, conv) in bfloat16, so they are converted once per weight update, not on
    every forward call (autocast converting the Nature CNN's weights per call dominated the inference
    worker's profile: docs/performance.md). Other layers (RNN cores, normalisers) keep their dtype."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            module.to(torch.bfloat16)




class Branch(nn.Module):
    """encoder -> core -> decoder: the actor's, and with separate weights also the critic's."""

    def __init__(self, obs_space: gym.Space, widths: dict, spec: ModelSpec):
        super().__init__()
        # a custom encoder for a Box space gets the tensor itself, not a one-field dict
        self.unwrap = spec.encoder_factory is not None and not is_structured(obs_space)
        if spec.encoder_factory is not None:
            self.encoder = spec.encoder_factory(obs_space, spec)
        else:
            self.encoder = ObservationEncoder(widths, spec)
        features = self.encoder.out_features
        if spec.core_factory is not None:
            self.core = spec.core_factory(features, spec)
        elif spec.use_rnn:
            self.core = RecurrentCore(spec.rnn_type, features, spec.rnn_size)
        else:
            self.core = None
        self.state_size = getattr(self.core, "state_size", 0) if self.core is not None else 0
        features = self.core.out_features if self.core is not None else features
        if spec.decoder_factory is not None:
            self.decoder = spec.decoder_factory(features, spec)
            self.out_features = self.decoder.out_features
        elif spec.decoder_mlp_layers:
            self.decoder = mlp(features, spec.decoder_mlp_layers, spec.nonlinearity)
            self.out_features = spec.decoder_mlp_layers[-1]
        else:
            self.decoder, self.out_features = None, features

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(x) if self.decoder is not None else x

    def encode(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.encoder(inputs["obs"] if self.unwrap else inputs)

    def core_step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.core is None:
            return x, state
        return self.core(x, state)


class ActorCritic(nn.Module):
    def __init__(self, obs_space: gym.Space, action_space: gym.Space, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.obs_space, self.action_space = obs_space, action_space  # another model of the same env (a teacher)
        self.preprocess = ObsPreprocessor(obs_space, spec.normalize_input)
        widths = self.preprocess.widths()
        self.actor = Branch(obs_space, widths, spec)
        self.critic = None if spec.share_weights else Branch(obs_space, widths, spec.for_critic())
        # a plain list (the modules are registered as actor and critic)
        self.branches = [self.actor] + ([self.critic] if self.critic is not None else [])
        self.state_sizes = [branch.state_size for branch in self.branches]
        self.rnn_state_size = sum(self.state_sizes)
        self.returns_norm = RunningMeanStd((), clip=1e6) if spec.normalize_returns else None
        self.action_head = make_action_head(action_space, self.actor.out_features, spec.continuous_tanh_scale,
                                            spec.initial_log_std)
        value_features = (self.critic or self.actor).out_features
        self.value_head = nn.Linear(value_features, 1)
        self._init_weights()

    def _init_weights(self) -> None:
        # Orthogonal init with small policy/value output gains: the standard PPO recipe.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(module.weight, gain=np.sqrt(2))
                nn.init.zeros_(module.bias)
        for linear, gain in ((self._policy_linear(), 0.01), (self.value_head, 1.0)):
            nn.init.orthogonal_(linear.weight, gain=gain)

    def _policy_linear(self) -> nn.Linear:
        head = self.action_head
        return head.mean if hasattr(head, "mean") else head.linear

    @property
    def recurrent(self) -> bool:
        return self.rnn_state_size > 0

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(batch, self.rnn_state_size, device=device)

    def update_obs_stats(self, obs: torch.Tensor, gather: Gather | None = None) -> None:
        """Fold a batch of stored observations into the input normalisation (the learner does this;
        `gather`: a learner group's, see RunningMeanStd.update)."""
        self.preprocess.update(obs, gather)

    # ------------------------------------------------------------------ forward passes
    def _encode(self, obs: torch.Tensor) -> list[torch.Tensor]:
        inputs = self.preprocess.prepare(obs)
        return [branch.encode(inputs) for branch in self.branches]

    def _heads(self, outputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        actor = self.actor.decode(outputs[0])
        if self.critic is None and torch.is_grad_enabled():
            return self._shared_heads(actor)
        critic = actor if self.critic is None else self.critic.decode(outputs[1])
        return self.action_head(actor), self.value_head(critic).squeeze(-1)

    def _shared_heads(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy and value linears of one feature tensor as one matrix product. Two heads on the same
        features cost two thin GEMMs forward and backward plus a sum of their [batch, features]
        gradients; one GEMM costs about half of that (docs/performance.md). Only for training: in
        inference there is no backward pass to save, and concatenating the weights per call gains
        nothing."""
        policy = self._policy_linear()
        weight = torch.cat([policy.weight, self.value_head.weight])
        bias = torch.cat([policy.bias, self.value_head.bias])
        both = nn.functional.linear(features, weight, bias)
        return self.action_head.from_linear(both[..., :-1]), both[..., -1]

    def _core_step(self, features: list[torch.Tensor], state: torch.Tensor
                   ) -> tuple[list[torch.Tensor], torch.Tensor]:
        states = state.split(self.state_sizes, dim=-1)
        results = [branch.core_step(x, s) for branch, x, s in zip(self.branches, features, states)]
        return [y for y, _ in results], torch.cat([s for _, s in results], dim=-1)

    def action_params(self, obs: torch.Tensor) -> torch.Tensor:
        """Feed-forward, the actor alone: the action distribution's parameters, without the critic's body (the
        inference worker's call when the learner computes the values: Config.values_at_learner)."""
        return self.action_head(self.actor.decode(self.actor.encode(self.preprocess.prepare(obs))))

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One time step for a batch of envs: (distribution parameters, normalized value, new state)."""
        outputs, state = self._core_step(self._encode(obs), state)
        params, values = self._heads(outputs)
        return params, values, state

    def step_fields(self, fields: dict[str, torch.Tensor], state: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """step() from observation fields already unpacked (ObsPreprocessor.prepare_fields)."""
        inputs = self.preprocess.prepare_fields(fields)
        outputs, state = self._core_step([branch.encode(inputs) for branch in self.branches], state)
        params, values = self._heads(outputs)
        return params, values, state

    def sequence(self, obs: torch.Tensor, state: torch.Tensor, resets: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """[L, B] sequences from initial states [B, S]; resets[t] zeroes the state before step t (an
        episode ended at t-1). Returns parameters [L, B, P] and normalized values [L, B]."""
        L, B = obs.shape[:2]
        features = [f.view(L, B, -1) for f in self._encode(obs.flatten(0, 1))]
        if not self.recurrent:
            params, values = self._heads([f.flatten(0, 1) for f in features])
            return params.view(L, B, -1), values.view(L, B)
        keep = (~resets).unsqueeze(-1).to(state.dtype)
        steps = []
        for t in range(L):
            if t > 0:
                state = state * keep[t]
            outputs, state = self._core_step([f[t] for f in features], state)
            steps.append(outputs)
        outputs = [torch.cat([s[i] for s in steps]) for i in range(len(features))]
        params, values = self._heads(outputs)
        return params.view(L, B, -1), values.view(L, B)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed-forward shortcut: (action-distribution parameters, value in normalized units)."""
        if self.recurrent:
            raise RuntimeError("a recurrent model needs its state: call step(obs, state) or sequence(...)")
        outputs = self._encode(obs)
        return self._heads(outputs)

    def distribution(self, params: torch.Tensor) -> ActionDistribution:
        return self.action_head.distribution(params)

    def denormalize_value(self, value: torch.Tensor) -> torch.Tensor:
        return self.returns_norm.denormalize(value) if self.returns_norm is not None else value

    def normalize_value(self, value: torch.Tensor) -> torch.Tensor:
        if self.returns_norm is None:
            return value
        mean, std = self.returns_norm._mean_std(value.dtype)
        return (value - mean) / std  # unclipped, unlike observations


def layer_summary(model: "ActorCritic") -> str:
    """The model's layers in order, for the console: `conv 4→32 8×8, ..., linear 3136→512, grucell 512→128,
    action 128→6, value 128→1`."""
    heads = {id(m): "action" for m in model.action_head.modules()}
    heads[id(model.value_head)] = "value"
    parts = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            k = module.kernel_size
            parts.append(f"conv {module.in_channels}→{module.out_channels} {k[0]}×{k[1]}")
        elif isinstance(module, nn.Linear):
            parts.append(f"{heads.get(id(module), 'linear')} {module.in_features}→{module.out_features}")
        elif isinstance(module, (nn.GRU, nn.LSTM, nn.GRUCell, nn.LSTMCell)):
            parts.append(f"{type(module).__name__.lower()} {module.input_size}→{module.hidden_size}")
    return ", ".join(parts)
