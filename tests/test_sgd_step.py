"""The learner's SGD step (algo/nodes.py): its statistics, and a non-finite loss that must not reach the weights."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from sf_core.algo.graph import Context, ModelSlot
from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.nodes import STEP_STATS, _ppo_policy_loss, _sgd_step
from sf_core.algo.params import LearningParams
from sf_core.config import Config

B = 64


def step_context() -> tuple[Context, ActorCritic, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    cfg = Config(env="x", batch_size=B, encoder_mlp_layers=[16])
    obs_space, action_space = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)
    model = ActorCritic(obs_space, action_space, ModelSpec.from_config(cfg))
    ctx = Context({"actor_critic": ModelSlot(model, torch.optim.Adam(model.parameters(), lr=1e-3))},
                  LearningParams.from_config(cfg))
    minibatch = {"obs": torch.randn(1, B, 4), "actions": torch.randint(0, 2, (1, B)), "log_prob": torch.full((1, B), -0.7),
                 "advantages": torch.randn(1, B), "targets": torch.randn(1, B), "old_values": torch.zeros(1, B),
                 "mask": torch.ones(1, B), "resets": torch.zeros(1, B, dtype=torch.bool),
                 "initial_states": torch.zeros(B, model.rnn_state_size)}
    return ctx, model, minibatch


def test_a_step_returns_its_statistics_and_moves_the_weights():
    ctx, model, minibatch = step_context()
    before = [t.clone() for t in model.parameters()]
    stats = dict(zip(STEP_STATS, _sgd_step(ctx, dict(minibatch), _ppo_policy_loss)[0].tolist()))
    p = ctx.params
    assert stats["loss"] == pytest.approx(stats["policy_loss"] + p.value_loss_coeff * stats["value_loss"]
                                          - p.exploration_loss_coeff * stats["entropy"], rel=1e-5, abs=1e-6)
    assert all(np.isfinite(v) for v in stats.values()) and stats["grad_norm"] > 0 and stats["entropy"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("poisoned", ["advantages", "targets"])
def test_a_non_finite_loss_is_named_and_leaves_the_weights_alone(poisoned):
    ctx, model, minibatch = step_context()
    minibatch[poisoned][0, 3] = float("nan")
    before = [t.clone() for t in model.parameters()]
    with pytest.raises(FloatingPointError, match="non-finite loss or gradients .* no optimizer step taken"):
        _sgd_step(ctx, dict(minibatch), _ppo_policy_loss)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
