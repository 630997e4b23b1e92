"""A trained policy as a self-contained model file: ONNX or TorchScript, runnable without sf_core.

`ExportedPolicy` wraps the actor-critic so that everything the framework does between an env's
observation and its action is inside the graph: observation preprocessing and normalization (the
running statistics are constants of the file), the recurrent core with its state as an explicit
input and output, and the deterministic action (the distribution's mode). What the file takes and
returns is written beside it as `policy.json` (see `io_description` and docs/sharing.md).

Inputs, batch first:
  obs                   a Box observation as the env gives it (uint8 images stay uint8, else float32)
  <field key>, ...      instead of `obs` for Dict/Tuple spaces: one input per field, named by its
                        path ("image", "state/position", "0"): Discrete fields int64 [B], others as Box
  rnn_state [B, S]      recurrent policies only: zeros at an episode's start
Outputs:
  action                int64 [B] (Discrete) or [B, k] (MultiDiscrete), float32 [B, d] (Box, unclipped)
  action_params         logits, or the Gaussian mean
  value                 the critic's value in reward units
  rnn_state_out [B, S]  recurrent policies only: feed it back as the next step's rnn_state
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Iterator

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from sf_core.algo.activations import ELU
from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.observations import PackedObs, is_structured
from sf_core.envs.registry import EnvContext, registry_snapshot
from sf_core.config import Config, ConfigError
from sf_core.records import checkpoint
from sf_core.records.policy_choice import find_policy_checkpoint

FORMATS = {"onnx": "policy.onnx", "torchscript": "policy.pt"}
OUTPUTS = ["action", "action_params", "value"]


@dataclass
class TrainedPolicy:
    """A checkpoint's model with the spaces of the env it was trained on."""

    cfg: Config
    model: ActorCritic
    obs_space: gym.Space
    action_space: gym.Space
    checkpoint_path: str
    version: int
    policy_index: int | None = 0  # which policy of a run of several (--num_policies)


def load_trained_policy(experiment_path: str, which: str = "latest", env: str | None = None,
                        policy_index: int | None = None) -> TrainedPolicy:
    """The experiment's model as trained (config.json), with the weights of checkpoint `which` of policy
    `policy_index` (default: the best policy of a run of several, see sf_core.records.policy_choice.choose_policy)."""
    cfg, path, index = find_policy_checkpoint(experiment_path, which, policy_index)
    state = checkpoint.load(path)
    # one env only to read its spaces, as the runner probes them
    probe = registry_snapshot().make(env or cfg.env, cfg, EnvContext(worker_index=-1, env_index=0, seed=0))
    obs_space, action_space = probe.observation_space, probe.action_space
    probe.close()
    model = ActorCritic(obs_space, action_space, ModelSpec.from_config(cfg))
    model.load_state_dict(state["model"])
    return TrainedPolicy(cfg, model.eval(), obs_space, action_space, path, int(state["version"]), index)


def obs_fields(space: gym.Space) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    """(input name, per-step shape, dtype) of each observation input of the exported model."""
    if is_structured(space):
        return [(f.key, f.shape, f.dtype) for f in PackedObs(space).fields]
    dtype = np.dtype(np.uint8 if space.dtype == np.uint8 else np.float32)
    return [("obs", tuple(space.shape), dtype)]


class ExportedPolicy(nn.Module):
    """forward(*observation inputs, [rnn_state]) -> (action, action_params, value, [rnn_state_out])."""

    def __init__(self, model: ActorCritic, obs_space: gym.Space):
        super().__init__()
        self.model = plain_activations(copy.deepcopy(model))
        self.keys = [name for name, _, _ in obs_fields(obs_space)]
        self.structured = is_structured(obs_space)
        self.recurrent = model.recurrent
        self.train(False)  # exported for acting: an exporter warns of, and would trace, a module in training mode

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        fields = dict(zip(self.keys, inputs))
        if self.recurrent:
            state = inputs[len(self.keys)]
        else:  # a feed-forward model carries an empty state
            state = torch.zeros(inputs[0].shape[0], 0, dtype=torch.float32)
        if self.structured:
            params, value, state = self.model.step_fields(fields, state)
        else:
            params, value, state = self.model.step(fields["obs"], state)
        outputs = (self.model.distribution(params).mode(), params, self.model.denormalize_value(value))
        return outputs + (state,) if self.recurrent else outputs

    def input_names(self) -> list[str]:
        return self.keys + (["rnn_state"] if self.recurrent else [])

    def output_names(self) -> list[str]:
        return OUTPUTS + (["rnn_state_out"] if self.recurrent else [])


def plain_activations(model: nn.Module) -> nn.Module:
    """Swap our CPU-speed ELU (in-place ops and an `out=` argument, which exporters cannot trace) for
    torch's, the same function."""
    for name, child in model.named_children():
        if isinstance(child, ELU):
            setattr(model, name, nn.ELU())
        else:
            plain_activations(child)
    return model


def example_inputs(policy: TrainedPolicy, batch: int = 2) -> tuple[torch.Tensor, ...]:
    """Inputs of the right shapes and dtypes to trace the export with."""
    tensors = [torch.zeros((batch, *shape), dtype=torch.from_numpy(np.empty(0, dtype)).dtype)
               for _, shape, dtype in obs_fields(policy.obs_space)]
    if policy.model.recurrent:
        tensors.append(policy.model.initial_state(batch))
    return tuple(tensors)


def export_onnx(policy: TrainedPolicy, path: str) -> str:
    """ONNX through torch.export (the `onnxscript` package), with a dynamic batch dimension."""
    wrapper = ExportedPolicy(policy.model, policy.obs_space)
    inputs = example_inputs(policy)
    batch = torch.export.Dim("batch")
    with torch.no_grad(), _quiet_exporter():
        torch.onnx.export(wrapper, inputs, path, input_names=wrapper.input_names(),
                          output_names=wrapper.output_names(), dynamo=True, external_data=False, verbose=False,
                          dynamic_shapes=(tuple({0: batch} for _ in inputs),))  # forward(*inputs): one group
    return path


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's notes about torch itself (torchvision's operators absent, its own deprecations) say nothing
    about the policy being exported, and read like a failure to a user: kept off the console. Its errors stay."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        registration.setLevel(level)


def export_torchscript(policy: TrainedPolicy, path: str) -> str:
    """A traced TorchScript module: `torch.jit.load(path)(*inputs)`, no sf_core import needed."""
    wrapper = ExportedPolicy(policy.model, policy.obs_space)
    with torch.no_grad():
        traced = torch.jit.trace(wrapper, example_inputs(policy), check_trace=False)
    traced.save(path)
    return path


def io_description(policy: TrainedPolicy, fmt: str) -> dict:
    """policy.json: what the exported file takes and returns, and what it was exported from."""
    wrapper = ExportedPolicy(policy.model, policy.obs_space)
    inputs = [{"name": name, "shape": ["batch", *shape], "dtype": str(dtype)}
              for name, shape, dtype in obs_fields(policy.obs_space)]
    state_size = policy.model.rnn_state_size
    if state_size:
        inputs.append({"name": "rnn_state", "shape": ["batch", state_size], "dtype": "float32",
                       "note": "zeros at an episode's start; then the previous step's rnn_state_out"})
    return {"format": fmt, "env": policy.cfg.env, "checkpoint": os.path.basename(policy.checkpoint_path),
            "policy_version": policy.version, "policy_index": policy.policy_index, "inputs": inputs,
            "outputs": wrapper.output_names(),
            "action_space": str(policy.action_space), "observation_space": str(policy.obs_space),
            "rnn_state_size": state_size}


def export(experiment_path: str, fmt: str, which: str = "latest", output: str | None = None,
           policy_index: int | None = None) -> str:
    """Export checkpoint `which` of an experiment's policy `policy_index` (default: the best); returns the
    file's path (policy.json beside it)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown --format={fmt!r}; known: {', '.join(FORMATS)}")
    policy = load_trained_policy(experiment_path, which, policy_index=policy_index)
    path = output or os.path.join(experiment_path, "export", FORMATS[fmt])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    (export_onnx if fmt == "onnx" else export_torchscript)(policy, path)
    with open(os.path.join(os.path.dirname(os.path.abspath(path)), "policy.json"), "w") as f:
        json.dump(io_description(policy, fmt), f, indent=2)
    return path
