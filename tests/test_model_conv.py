"""Conv encoders for image observations: shapes, uint8 scaling, no per-pixel normalization, flags,
the architecture `auto` picks for an image's size."""

import logging

import gymnasium as gym
import numpy as np
import pytest
import torch

from sf_core.algo.conv_encoders import (ARCHITECTURE_CHOICES, ImpalaResNet, NatureCNN, SmallInputCNN, output_hw,
                                small_input_strides)
from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.cli.arguments import parse_args
from sf_core.config import Config, _FIELDS
from sf_core.machine.wiring import initial_model

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


# ------------------------------------------------------------------------------------------ image sizes
NATURE_ACTOR_CRITIC_PARAMETERS = 1_687_719  # 4×84×84 frames, 6 actions: counted before `auto` existed


def test_auto_keeps_exactly_the_nature_cnn_for_atari_frames():
    torch.manual_seed(0)
    auto = ActorCritic(ATARI_OBS, gym.spaces.Discrete(6), ModelSpec())
    torch.manual_seed(0)
    nature = ActorCritic(ATARI_OBS, gym.spaces.Discrete(6), ModelSpec(encoder_conv_architecture="convnet_atari"))
    assert type(auto.actor.encoder.convs["obs"][0]) is NatureCNN
    assert sum(p.numel() for p in auto.parameters()) == NATURE_ACTOR_CRITIC_PARAMETERS
    # same parameter names and, from the same seed, the same weights: old checkpoints load unchanged
    auto_state, nature_state = auto.state_dict(), nature.state_dict()
    assert list(auto_state) == list(nature_state)
    assert all(torch.equal(auto_state[k], nature_state[k]) for k in auto_state)


@pytest.mark.parametrize("shape, trunk", [((1, 1, 1), SmallInputCNN), ((1, 8, 8), SmallInputCNN),
                                          ((3, 16, 16), SmallInputCNN), ((16, 16, 3), SmallInputCNN),
                                          ((2, 1, 40), SmallInputCNN), ((3, 35, 35), SmallInputCNN),
                                          ((3, 36, 36), NatureCNN), ((4, 84, 84), NatureCNN)])
def test_auto_builds_a_trunk_that_fits_every_image_size(shape, trunk):
    model = ActorCritic(gym.spaces.Box(0, 255, shape, np.uint8), gym.spaces.Discrete(3),
                        ModelSpec(encoder_conv_mlp_layers=(32,), share_weights=False))
    assert type(model.actor.encoder.convs["obs"][0]) is trunk
    obs = torch.randint(0, 256, (4, *shape), dtype=torch.uint8)
    params, values = model(obs)
    assert params.shape == (4, 3) and values.shape == (4,)
    assert torch.isfinite(params).all() and torch.isfinite(values).all()
    (params.sum() + values.sum()).backward()
    assert all(p.grad is not None for p in model.actor.encoder.parameters())


@pytest.mark.parametrize("arch", ["resnet_impala", "convnet_small"])
@pytest.mark.parametrize("hw", [(1, 1), (8, 8), (16, 16)])
def test_explicit_architectures_that_fit_small_images_are_kept(arch, hw):
    model = ActorCritic(gym.spaces.Box(0, 255, (3, *hw), np.uint8), gym.spaces.Discrete(2),
                        ModelSpec(encoder_conv_architecture=arch, encoder_conv_mlp_layers=(16,)))
    assert type(model.actor.encoder.convs["obs"][0]) is {"resnet_impala": ImpalaResNet, "convnet_small": SmallInputCNN}[arch]
    params, values = model(torch.zeros(2, 3, *hw, dtype=torch.uint8))
    (params.sum() + values.sum()).backward()


def test_small_input_strides_halve_sides_of_8_or_more():
    assert small_input_strides((1, 1)) == [(1, 1)] * 3
    assert small_input_strides((8, 8)) == [(2, 2), (1, 1), (1, 1)]
    assert small_input_strides((16, 16)) == [(2, 2), (2, 2), (1, 1)]
    assert small_input_strides((35, 4)) == [(2, 1), (2, 1), (2, 1)]


@pytest.mark.parametrize("hw", [(1, 1), (7, 9), (35, 35), (36, 36), (40, 51), (84, 84)])
def test_output_size_arithmetic_matches_the_trunks(hw):
    """`output_hw` decides whether a trunk fits without running it: it must agree with torch."""
    for trunk in (NatureCNN(2, "relu"), ImpalaResNet(2, "relu"), SmallInputCNN(2, "relu", hw)):
        predicted = output_hw(trunk, hw)
        try:
            with torch.no_grad():
                flat = trunk(torch.zeros(1, 2, *hw)).shape[1]
        except RuntimeError:
            assert predicted is None, trunk
            continue
        channels = 32 if isinstance(trunk, ImpalaResNet) else 64
        assert predicted is not None and flat == channels * predicted[0] * predicted[1], trunk


def test_an_explicit_architecture_that_cannot_fit_names_the_shape_and_the_flag():
    space = gym.spaces.Dict({"minimap": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
                             "vector": gym.spaces.Box(-1, 1, (2,), np.float32)})
    with pytest.raises(ValueError) as error:
        ActorCritic(space, gym.spaces.Discrete(2), ModelSpec(encoder_conv_architecture="convnet_atari"))
    message = str(error.value)
    assert "'minimap'" in message and "3×16×16" in message and "36×36" in message
    assert "--encoder_conv_architecture" in message


def test_the_choice_is_logged_once_per_image_field():
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("sf_core")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    space = gym.spaces.Dict({"minimap": gym.spaces.Box(0, 255, (3, 16, 16), np.uint8),
                             "frame": gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)})
    try:
        initial_model(Config(actor_critic_share_weights=False), space, gym.spaces.Discrete(2), 0, None)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    convs = sorted(r for r in records if r.startswith("conv encoder"))
    assert len(convs) == 2, records  # the critic's own encoders are not logged again
    assert "'frame' 4×36×36: convnet_atari (--encoder_conv_architecture=auto)" in convs[0]
    assert "'minimap' 3×16×16: convnet_small (--encoder_conv_architecture=auto" in convs[1]


def test_auto_is_the_default_and_the_flag_lists_every_architecture():
    assert Config().encoder_conv_architecture == "auto"
    assert tuple(_FIELDS["encoder_conv_architecture"].metadata["choices"]) == ARCHITECTURE_CHOICES
