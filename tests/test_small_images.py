"""Small image observations train with the default conv encoder (the Nature CNN does not fit them)."""

import pytest

from sf_core import register_env
from tests.helpers import train
from tests.image_envs import make_lit_pixel, make_minimap_dict

COMMON = ("--num_workers=2", "--num_envs_per_worker=8", "--rollout=8", "--batch_size=256", "--num_epochs=2",
          "--encoder_conv_mlp_layers", "32", "--ppo_clip_ratio=0.2", "--learning_rate=1e-3",
          "--target_mean_return=0.8", "--train_for_env_steps=300000", "--train_for_seconds=120", "--seed=1")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_single_channel_8x8_image_trains_past_chance(tmp_path):
    register_env("LitPixel8-v0", make_lit_pixel)
    code, summary = train(tmp_path, "--env=LitPixel8-v0", *COMMON)
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, summary
    assert summary["mean_return_at_target"] >= 0.8, summary  # chance is 0.5


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_dict_of_16x16_image_and_vector_trains_past_chance(tmp_path):
    register_env("MinimapDict-v0", make_minimap_dict)
    code, summary = train(tmp_path, "--env=MinimapDict-v0", "--encoder_mlp_layers", "16",
                          "--decoder_mlp_layers", "32", *COMMON)
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, summary
    assert summary["mean_return_at_target"] >= 0.8, summary  # chance is 0.25, either field alone 0.5


@pytest.mark.slow
def test_an_explicit_architecture_that_cannot_fit_stops_before_any_process(tmp_path, capsys):
    register_env("LitPixel8-v0", make_lit_pixel)
    code, summary = train(tmp_path, "--env=LitPixel8-v0", "--encoder_conv_architecture=convnet_atari")
    assert code == 1 and summary == {}  # stopped while building the model: no experiment folder written
    error = capsys.readouterr().err
    assert error.startswith("sf_core.train: error: --encoder_conv_architecture=convnet_atari does not fit"), error
    assert "1×8×8" in error and "--encoder_conv_architecture=auto" in error
