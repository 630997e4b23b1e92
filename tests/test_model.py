"""Action heads against torch.distributions, and the normaliser's cached statistics."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal

from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.normalization import RunningMeanStd

SPACES = {
    "discrete": gym.spaces.Discrete(3),
    "multidiscrete": gym.spaces.MultiDiscrete([2, 4]),
    "box": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
}


def reference(space, params, model):
    if isinstance(space, gym.spaces.Discrete):
        return [Categorical(logits=params)]
    if isinstance(space, gym.spaces.MultiDiscrete):
        return [Categorical(logits=p) for p in torch.split(params, [2, 4], dim=-1)]
    return [Normal(params, model.action_head.log_std.exp())]


@pytest.mark.parametrize("name", SPACES)
def test_heads_match_torch_distributions(name):
    torch.manual_seed(0)
    space = SPACES[name]
    model = ActorCritic(gym.spaces.Box(-1, 1, (5,), np.float32), space, ModelSpec(encoder_mlp_layers=(16,)))
    obs = torch.randn(64, 5)
    params, values = model(obs)
    assert values.shape == (64,)
    dist = model.distribution(params)
    actions = dist.sample()
    ref = reference(space, params, model)
    if name == "discrete":
        assert actions.shape == (64,) and actions.dtype == torch.int64 and actions.max() < 3
        ref_lp, ref_ent = ref[0].log_prob(actions), ref[0].entropy()
    elif name == "multidiscrete":
        assert actions.shape == (64, 2) and (actions[:, 0] < 2).all() and (actions[:, 1] < 4).all()
        ref_lp = ref[0].log_prob(actions[:, 0]) + ref[1].log_prob(actions[:, 1])
        ref_ent = ref[0].entropy() + ref[1].entropy()
    else:
        assert actions.shape == (64, 2) and actions.dtype == torch.float32
        ref_lp, ref_ent = ref[0].log_prob(actions).sum(-1), ref[0].entropy().sum(-1)
    torch.testing.assert_close(dist.log_prob(actions), ref_lp)
    torch.testing.assert_close(dist.entropy(), ref_ent)


def test_gaussian_samples_and_kl_match_torch_distributions():
    """The Gaussian is written out (algo/distributions.py): its samples' moments and its KL against torch's."""
    from torch.distributions import kl_divergence

    from sf_core.algo.distributions import GaussianDist

    torch.manual_seed(0)
    mean, log_std = torch.tensor([[0.5, -2.0]]).expand(40000, 2), torch.tensor([0.0, -1.0])
    samples = GaussianDist(mean, log_std).sample()
    torch.testing.assert_close(samples.mean(0), mean[0], atol=0.02, rtol=0)
    torch.testing.assert_close(samples.std(0), log_std.exp(), atol=0.02, rtol=0)
    p_mean, q_mean, q_log_std = torch.randn(8, 3), torch.randn(8, 3), torch.randn(3)
    p_log_std = torch.randn(3, requires_grad=True)
    ours = GaussianDist(p_mean, p_log_std).kl_from(GaussianDist(q_mean, q_log_std))
    theirs = kl_divergence(Normal(q_mean, q_log_std.exp()), Normal(p_mean, p_log_std.exp())).sum(-1)
    torch.testing.assert_close(ours, theirs)
    grad, = torch.autograd.grad(ours.sum(), p_log_std)
    theirs_grad, = torch.autograd.grad(theirs.sum(), p_log_std)
    torch.testing.assert_close(grad, theirs_grad)


def test_categorical_samples_follow_the_probabilities():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    from sf_core.algo.distributions import CategoricalDist

    torch.manual_seed(1)
    counts = torch.bincount(CategoricalDist(logits, [3], True).sample(), minlength=3).float() / 20000
    torch.testing.assert_close(counts, torch.tensor([0.7, 0.2, 0.1]), atol=0.015, rtol=0)


def test_normaliser_cache_follows_updates_and_loads():
    rms = RunningMeanStd((2,))
    x = torch.tensor([[10.0, -3.0]])
    before = rms.normalize(x).clone()
    rms.update(torch.randn(1000, 2) * 4 + torch.tensor([10.0, -3.0]))
    after = rms.normalize(x)
    assert not torch.allclose(before, after)
    assert after.abs().max() < 0.2  # x is now near the mean
    fresh = RunningMeanStd((2,))
    fresh.normalize(x)  # fill its cache with the initial statistics
    fresh.load_state_dict(rms.state_dict())
    torch.testing.assert_close(fresh.normalize(x), after)


@pytest.mark.parametrize("name", SPACES)
def test_shared_heads_equal_the_separate_layers(name):
    """The policy and value linears computed as one matrix product give what each layer gives alone,
    and gradients reach both layers' parameters."""
    torch.manual_seed(0)
    spec = ModelSpec(encoder_mlp_layers=(16,), continuous_tanh_scale=2.0 if name == "box" else 0.0)
    model = ActorCritic(gym.spaces.Box(-1, 1, (5,), np.float32), SPACES[name], spec)
    features = model.actor.encode(model.preprocess.prepare(torch.randn(32, 5)))
    params, values = model._heads([features])  # with gradients: the one-GEMM path
    torch.testing.assert_close(params, model.action_head(features))
    torch.testing.assert_close(values, model.value_head(features).squeeze(-1))
    with torch.no_grad():  # inference: the two layers
        inference_params, inference_values = model._heads([features])
    torch.testing.assert_close(inference_params, params.detach())
    torch.testing.assert_close(inference_values, values.detach())
    (params.sum() + values.sum()).backward()
    assert model._policy_linear().weight.grad.abs().sum() > 0 and model.value_head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(512, 64), (256, 64), (4, 8)])  # ours both ways, ours in inference, torch's
def test_tanh_matches_torch(dtype, shape):
    """Our tanh (sf_core.algo.activations) against torch's, forward and backward, at 0, ±1e-8 and saturated."""
    from sf_core.algo.activations import Tanh, _FromOutput, _tanh

    torch.manual_seed(0)
    x = (torch.randn(*shape) * 3).to(dtype)
    x[0, :6] = torch.tensor([0.0, -0.0, 1e-8, -1e-8, 30.0, -30.0])
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, y_ref = Tanh()(ours), torch.tanh(theirs)
    ours_in_training = dtype == torch.float32 and x.numel() >= 32768
    assert ("_FromOutput" in type(y.grad_fn).__name__) == ours_in_training
    grad = torch.randn_like(y)
    y.backward(grad)
    y_ref.backward(grad)
    tolerance = {"atol": 3e-7, "rtol": 1e-6} if dtype == torch.float32 else {"atol": 0.0, "rtol": 0.0}
    torch.testing.assert_close(y, y_ref, **tolerance)
    torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(Tanh()(x), y_ref.detach(), **tolerance)
    function = lambda x: _FromOutput.apply(x, _tanh, torch.ops.aten.tanh_backward)  # noqa: E731
    assert torch.autograd.gradcheck(function, torch.randn(40, dtype=torch.float64, requires_grad=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(256, 64), (4, 8)])  # our kernels, and torch's for small tensors
def test_elu_matches_torch(dtype, shape, monkeypatch):
    """Our ELU (sf_core.algo.activations) against torch's, forward and backward, on both sides of zero."""
    from sf_core.algo import activations
    from sf_core.algo.activations import ELU

    torch.manual_seed(0)
    x = (torch.randn(*shape) * 3).to(dtype)
    x[0, :4] = torch.tensor([0.0, -0.0, 1e-8, -1e-8])
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, y_ref = ELU()(ours), torch.nn.functional.elu(theirs)
    grad = torch.randn_like(y)
    y.backward(grad)
    y_ref.backward(grad)
    tolerance = {"atol": 1e-6, "rtol": 1e-6} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}
    torch.testing.assert_close(y, y_ref, **tolerance)
    torch.testing.assert_close(ours.grad, theirs.grad, **tolerance)
    with torch.no_grad():
        torch.testing.assert_close(ELU()(x), y_ref.detach(), **tolerance)
    monkeypatch.setattr(activations, "_MIN_ELEMENTS", 0)  # our backward on a tensor gradcheck can afford
    assert torch.autograd.gradcheck(ELU(), torch.randn(40, dtype=torch.float64, requires_grad=True))
