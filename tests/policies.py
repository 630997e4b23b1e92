"""Experiment folders holding a policy with random weights (config.json + a checkpoint), and observations
recorded from its env: what export and sharing tests need, without training."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import torch

from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.observations import ObsWriter, obs_storage
from sf_core.envs.registry import EnvContext, registry_snapshot
from sf_core.config import Config
from sf_core.records import checkpoint


def record(env, steps: int, seed: int = 0) -> tuple[list, np.ndarray]:
    """`steps` observations under random actions, and whether each one starts an episode."""
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    observations, starts = [obs], [True]
    while len(observations) < steps:
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
        observations.append(obs)
        starts.append(terminated or truncated)
    return observations, np.array(starts)


def packed(space, observations: list) -> torch.Tensor:
    """Observations as the framework stores them (one row each), the model's input."""
    shape, dtype = obs_storage(space)
    rows = torch.zeros((len(observations), *shape), dtype=dtype)
    writer = ObsWriter(space)
    for i, obs in enumerate(observations):
        writer.write(obs, rows.numpy()[i])
    return rows


def random_policy_experiment(train_dir, name: str, env: str, steps: int = 1000, **flags
                             ) -> tuple[str, ActorCritic, list, np.ndarray]:
    """{train_dir}/{name} with config.json and one checkpoint of a random-weight model, its input
    normalization fitted to `steps` recorded observations; returns (path, model, observations, starts)."""
    cfg = Config(env=env, experiment=name, train_dir=str(train_dir), seed=0, **flags)
    path = os.path.join(str(train_dir), name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(cfg.to_json())
    instance = registry_snapshot().make(env, cfg, EnvContext(worker_index=-1, env_index=0, seed=0))
    observations, starts = record(instance, steps)
    torch.manual_seed(0)
    model = ActorCritic(instance.observation_space, instance.action_space, ModelSpec.from_config(cfg))
    instance.close()
    model.update_obs_stats(packed(instance.observation_space, observations))
    if model.returns_norm is not None:
        model.returns_norm.update(torch.randn(256) * 3.0 + 5.0)
    spread_actions(model, packed(instance.observation_space, observations))
    state = {"model": model.state_dict(), "version": 7, "runner": {"frames": 1000}}
    checkpoint.save(checkpoint.checkpoint_dir(path), state, keep=1, is_best=False)
    return path, model.eval(), observations, starts


@torch.no_grad()
def spread_actions(model: ActorCritic, rows: torch.Tensor) -> None:
    """Rescale the policy head so that each action's logit (or mean) varies with unit spread around 0
    over `rows`. A random model's head (gain 0.01) is nearly flat: its argmax is one action on every
    Atari frame, and near-ties could flip between two correct implementations in the last bit."""
    params = model.step(rows, model.initial_state(len(rows)))[0]
    scale = 1.0 / params.std(0).clamp(min=1e-8)
    linear = model._policy_linear()
    linear.weight.mul_(scale[:, None])
    linear.bias.sub_(params.mean(0)).mul_(scale)


def multi_policy_experiment(train_dir, name: str, mean_returns: Sequence[float | None],
                            best_policy: int | None = None, env: str = "CartPole-v1", **flags
                            ) -> tuple[str, list[ActorCritic]]:
    """{train_dir}/{name} as a run of len(mean_returns) policies leaves it: config.json with --num_policies,
    each policy's checkpoints in checkpoint_p{K}/ (weights from its own seed, the action head spread as
    `spread_actions` does, version 10 + K, `mean_returns[K]` in its runner dict, its own hyperparams),
    and, when `best_policy` is given, a training_summary.json naming it. Returns (path, the models by policy)."""
    n = len(mean_returns)
    cfg = Config(env=env, experiment=name, train_dir=str(train_dir), seed=0, num_policies=n,
                 encoder_mlp_layers=[16], **flags)
    path = os.path.join(str(train_dir), name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(cfg.to_json())
    instance = registry_snapshot().make(env, cfg, EnvContext(worker_index=-1, env_index=0, seed=0))
    rows = packed(instance.observation_space, record(instance, 200)[0])
    instance.close()
    models = []
    for k, mean_return in enumerate(mean_returns):
        torch.manual_seed(100 + k)
        model = ActorCritic(instance.observation_space, instance.action_space, ModelSpec.from_config(cfg))
        spread_actions(model, rows)  # so that the policies' actions differ, not only their weights
        runner = {"frames": 1000 * (k + 1), "mean_return": mean_return, "best_mean_return": mean_return}
        state = {"model": model.state_dict(), "version": 10 + k, "runner": runner,
                 "hyperparams": {"learning_rate": 1e-4 * (k + 1), "gamma": 0.99 - 0.01 * k}}
        checkpoint.save(checkpoint.checkpoint_dir(path, k, n), state, keep=2, is_best=True)
        models.append(model.eval())
    if best_policy is not None:
        policies = [{"policy": k, "mean_return": r, "episodes": 5, "policy_version": 10 + k,
                     "samples_trained": 1000, "hyperparams": {}} for k, r in enumerate(mean_returns)]
        with open(os.path.join(path, "training_summary.json"), "w") as f:
            json.dump({"running": False, "best_policy": best_policy, "policies": policies}, f)
    return path, models
