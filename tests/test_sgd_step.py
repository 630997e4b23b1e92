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


def textbook_ppo_step(model: ActorCritic, optimizer: torch.optim.Optimizer, mb: dict, p) -> dict[str, float]:
    """PPO's step as CleanRL writes it, with torch.distributions and torch's clipping: what the learner's
    leaner step must equal."""
    from torch.distributions import Normal

    obs, mask = mb["obs"][0], mb["mask"][0]
    mean, values = model(obs)
    dist = Normal(mean, model.action_head.log_std.exp())
    log_prob, entropy = dist.log_prob(mb["actions"][0]).sum(-1), dist.entropy().sum(-1)
    count = mask.sum()
    adv = mb["advantages"][0]
    adv_mean = (adv * mask).sum() / count
    adv = (adv - adv_mean) / (((adv - adv_mean) ** 2 * mask).sum() / count).sqrt().add(1e-8)
    ratio = (log_prob - mb["log_prob"][0]).exp()
    surrogate = torch.min(ratio * adv, ratio.clamp(1 - p.ppo_clip_ratio, 1 + p.ppo_clip_ratio) * adv)
    policy_loss = -(surrogate * mask).sum() / count
    old, targets = mb["old_values"][0], mb["targets"][0]
    clipped = old + (values - old).clamp(-p.ppo_clip_value, p.ppo_clip_value)
    value_loss = 0.5 * (torch.max((values - targets) ** 2, (clipped - targets) ** 2) * mask).sum() / count
    entropy = (entropy * mask).sum() / count
    loss = policy_loss + p.value_loss_coeff * value_loss - p.exploration_loss_coeff * entropy
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), p.max_grad_norm)
    optimizer.step()
    return {"loss": loss.item(), "policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
            "entropy": entropy.item(), "grad_norm": grad_norm.item()}


def test_the_step_equals_textbook_ppo_on_a_gaussian_policy_with_masked_samples():
    """Separate actor and critic, a Gaussian head, a quarter of the samples masked out, advantages normalized,
    values clipped, gradients clipped: the same losses, norm and weights after the step as CleanRL's math."""
    import copy

    torch.manual_seed(0)
    cfg = Config(env="x", batch_size=B, encoder_mlp_layers=[16, 16], actor_critic_share_weights=False,
                 ppo_clip_value=0.2, max_grad_norm=0.5, exploration_loss_coeff=0.01)
    obs_space, action_space = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Box(-1, 1, (3,), np.float32)
    model = ActorCritic(obs_space, action_space, ModelSpec.from_config(cfg))
    reference = copy.deepcopy(model)
    # plain SGD: the weights then move by the gradients themselves (Adam's first step moves each by about lr)
    ctx = Context({"actor_critic": ModelSlot(model, torch.optim.SGD(model.parameters(), lr=0.1))},
                  LearningParams.from_config(cfg))
    mask = (torch.rand(1, B) > 0.25).float()
    obs = torch.randn(1, B, 4)
    with torch.no_grad():  # values the samples were collected with: most within the clip range of today's
        old_values = model(obs[0])[1][None] + torch.randn(1, B) * 0.15
    minibatch = {"obs": obs, "actions": torch.randn(1, B, 3), "log_prob": torch.randn(1, B) - 3,
                 "advantages": torch.randn(1, B) * 3 + 1, "targets": torch.randn(1, B),
                 "old_values": old_values, "mask": mask, "resets": torch.zeros(1, B, dtype=torch.bool),
                 "initial_states": torch.zeros(B, model.rnn_state_size)}
    stats = dict(zip(STEP_STATS, _sgd_step(ctx, dict(minibatch), _ppo_policy_loss)[0].tolist()))
    expected = textbook_ppo_step(reference, torch.optim.SGD(reference.parameters(), lr=0.1), minibatch, ctx.params)
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert expected["grad_norm"] > 0.5  # the clipping acted
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs)


def test_gradient_clipping_equals_torchs():
    from sf_core.algo.gradient_clipping import clip_grad_norm

    torch.manual_seed(0)
    for max_norm in (0.5, 100.0, float("inf")):
        a, b = torch.nn.Linear(5, 4), torch.nn.Linear(5, 4)
        b.load_state_dict(a.state_dict())
        x = torch.randn(7, 5) * 3
        for model in (a, b):
            model(x).pow(2).sum().backward()
        norm = clip_grad_norm(list(a.parameters()), max_norm)
        torch.testing.assert_close(norm, torch.nn.utils.clip_grad_norm_(b.parameters(), max_norm))
        for ours, theirs in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(ours.grad, theirs.grad)
    a.weight.grad[0, 0] = float("inf")
    assert not torch.isfinite(clip_grad_norm(list(a.parameters()), 0.5))


def test_the_clipped_terms_have_the_gradients_of_their_min_and_max_forms():
    """ppo.surrogate and ppo.value_error take their clipped branch without gradient where it wins: the values and
    gradients must be those of PPO's min/max forms, also where rounding makes the branches nearly equal."""
    from sf_core.algo import ppo

    torch.manual_seed(0)
    n = 20000
    values = (torch.randn(n) * 0.3).requires_grad_()
    old, targets = values.detach() + torch.randn(n) * 0.1, torch.randn(n)
    clipped = old + (values - old).clamp(-0.2, 0.2)
    reference = 0.5 * torch.max((values - targets) ** 2, (clipped - targets) ** 2)
    ours = ppo.value_error(values, old, targets, 0.2)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), values)[0],
                               torch.autograd.grad(reference.sum(), values)[0])

    log_prob = (torch.randn(n) * 0.2).requires_grad_()
    behaviour, advantages = log_prob.detach() + torch.randn(n) * 0.2, torch.randn(n)
    ratio = (log_prob - behaviour).exp()
    reference = torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    ours = ppo.surrogate(log_prob, behaviour, advantages, 0.2)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), log_prob)[0],
                               torch.autograd.grad(reference.sum(), log_prob)[0])
