"""Conv encoders for image observations: shapes, uint8 scaling, no per-pixel normalization, flags."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from algo.encoders import ImpalaResNet, NatureCNN
from algo.model import ActorCritic, ModelSpec
from sf_core.config import parse_args

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


@pytest.mark.parametrize("arch, trunk, flat", [("convnet_atari", NatureCNN, 64 * 7 * 7),
                                               ("resnet_impala", ImpalaResNet, 32 * 11 * 11)])
def test_conv_architectures_on_uint8_frames(arch, trunk, flat):
    torch.manual_seed(0)
    model = ActorCritic(ATARI_OBS, gym.spaces.Discrete(6), ModelSpec(encoder_conv_architecture=arch))
    conv = model.actor.encoder.convs["obs"]
    assert isinstance(conv[0], trunk)
    assert conv[1][0].in_features == flat and conv[1][0].out_features == 512
    assert len(model.preprocess.norms) == 0  # uint8 images: a fixed 1/255 scale, never running statistics
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    params, values = model(obs)
    assert params.shape == (5, 6) and values.shape == (5,)
    assert torch.isfinite(params).all() and torch.isfinite(values).all()
    # the scale is 1/255: the model sees the same input as float frames divided by 255
    prepared = model.preprocess.prepare(obs)["obs"]
    torch.testing.assert_close(prepared, obs.float() / 255.0)
    (params.sum() + values.sum()).backward()
    assert all(p.grad is not None for p in model.actor.encoder.parameters())


def test_separate_critic_encoder_and_continuous_actions():
    model = ActorCritic(ATARI_OBS, gym.spaces.Box(-1, 1, (3,), np.float32),
                        ModelSpec(share_weights=False, encoder_conv_mlp_layers=(64,)))
    assert model.critic is not None and model.critic.encoder is not model.actor.encoder
    params, values = model(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))
    assert params.shape == (2, 3) and values.shape == (2,)


def test_channels_last_float_images_get_one_scalar_normaliser():
    space = gym.spaces.Box(0.0, 1.0, (64, 64, 3), np.float32)  # [H, W, C]
    model = ActorCritic(space, gym.spaces.Discrete(2), ModelSpec(normalize_input=True))
    assert model.preprocess.layouts["obs"] == ((3, 64, 64), True)
    assert model.preprocess.norms["obs"].mean.shape == ()  # not per pixel
    obs = torch.rand(7, 64, 64, 3)
    model.update_obs_stats(obs)  # what the learner does with a batch of stored observations
    params, values = model(obs)
    assert params.shape == (7, 2) and values.shape == (7,)
    assert model.preprocess.prepare(obs)["obs"].shape == (7, 3, 64, 64)
    unnormalized = ActorCritic(space, gym.spaces.Discrete(2), ModelSpec(normalize_input=False))
    assert len(unnormalized.preprocess.norms) == 0


def test_vector_observations_keep_the_mlp_encoder():
    model = ActorCritic(gym.spaces.Box(-1, 1, (5,), np.float32), gym.spaces.Discrete(2),
                        ModelSpec(encoder_mlp_layers=(16,)))
    assert not model.actor.encoder.convs and isinstance(model.actor.encoder.mlp[0], torch.nn.Linear)
    assert model.preprocess.norms["obs"].mean.shape == (5,)


def test_conv_flags_reach_the_model_spec():
    cfg, _ = parse_args(["--env=CartPole-v1", "--encoder_conv_architecture=resnet_impala",
                         "--encoder_conv_mlp_layers", "256", "128"])
    spec = ModelSpec.from_config(cfg)
    assert spec.encoder_conv_architecture == "resnet_impala" and spec.encoder_conv_mlp_layers == (256, 128)
    from sf_core.config import ConfigError

    with pytest.raises(ConfigError):
        parse_args(["--env=CartPole-v1", "--encoder_conv_architecture=nature"])


@pytest.mark.parametrize("stored", ["chw", "hwc"])
def test_training_layout_gives_the_same_outputs_and_gradients(stored):
    """With gradients on, CPU images are converted to channels_last (faster oneDNN weight gradients);
    the model must compute the same function and the same weight gradients as in the default layout."""
    torch.manual_seed(0)
    shape = (4, 84, 84) if stored == "chw" else (84, 84, 4)
    model = ActorCritic(gym.spaces.Box(0, 255, shape, np.uint8), gym.spaces.Discrete(6), ModelSpec())
    obs = torch.randint(0, 256, (6, *shape), dtype=torch.uint8)
    params, values = model(obs)
    assert model.preprocess.prepare(obs)["obs"].is_contiguous(memory_format=torch.channels_last)
    (params.sum() + values.sum()).backward()
    grads = [p.grad.clone() for p in model.actor.encoder.parameters()]
    model.zero_grad()
    default_layout = model.preprocess.prepare(obs)["obs"].contiguous()
    assert default_layout.is_contiguous()
    params_ref, values_ref = model._heads([model.actor.encoder({"obs": default_layout})])
    (params_ref.sum() + values_ref.sum()).backward()
    torch.testing.assert_close(params, params_ref)
    torch.testing.assert_close(values, values_ref)
    for grad, p in zip(grads, model.actor.encoder.parameters()):
        torch.testing.assert_close(grad, p.grad, rtol=1e-4, atol=1e-5)
    with torch.no_grad():  # inference keeps the stored layout: NCHW frames stay NCHW, HWC ones channels_last
        stored_layout = torch.contiguous_format if stored == "chw" else torch.channels_last
        assert model.preprocess.prepare(obs)["obs"].is_contiguous(memory_format=stored_layout)
        torch.testing.assert_close(model(obs)[0], params.detach())
