"""An env without a preset gets defaults fitted to its spaces, under the flags typed, named on the console and
in config.json; Sample Factory's defaults stay Config's, and a small env learns with no model or learning flag."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from sf_core.cli.arguments import parse_args
from sf_core.config import Config
from sf_core.run.env_fit import SMALL_VECTOR_ENV, fit_to_spaces
from tests import launch
from tests.helpers import read_summary

BOX4, IMAGE = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(0, 255, (3, 64, 64), np.uint8)


def test_a_small_vector_env_is_fitted_and_images_and_large_spaces_are_not():
    fit = fit_to_spaces(BOX4, gym.spaces.Discrete(2))
    assert fit.values == SMALL_VECTOR_ENV and fit.spaces == "a vector observation of 4 numbers and 2 actions"
    assert fit_to_spaces(gym.spaces.Dict({"x": BOX4, "flag": gym.spaces.Discrete(3)}), gym.spaces.Box(-1, 1, (2,))
                         ).spaces == "a vector observation of 7 numbers and 2 continuous action dimensions"
    assert fit_to_spaces(IMAGE, gym.spaces.Discrete(6)) is None  # the conv defaults stay
    assert fit_to_spaces(gym.spaces.Dict({"x": BOX4, "camera": IMAGE}), gym.spaces.Discrete(2)) is None
    assert fit_to_spaces(gym.spaces.Box(-1, 1, (376,)), gym.spaces.Discrete(2)) is None
    assert fit_to_spaces(BOX4, gym.spaces.Discrete(100)) is None


def test_an_env_without_a_preset_gets_the_fitted_values_under_the_flags_typed_and_says_so():
    lines = []
    cfg, preset = parse_args(["--env=sf_core/Corridor-v0", "--batch_size=256"], announce=lines.append)
    assert preset is None
    assert (cfg.encoder_mlp_layers, cfg.learning_rate, cfg.num_epochs) == ([64, 64], 1e-3, 2)
    assert cfg.batch_size == 256 and cfg.env_fit == ["encoder_mlp_layers", "learning_rate", "num_epochs"]
    assert lines == ["applied defaults fitted to the env's spaces (a vector observation of 30 numbers and 2 "
                     "actions): --encoder_mlp_layers 64 64 --learning_rate=0.001 --num_epochs=2 (flags you pass "
                     "override them; --fit_defaults_to_env=False keeps Sample Factory's defaults)"]
    saved = json.loads(cfg.to_json())
    assert saved["env_fit"] == cfg.env_fit and saved["learning_rate"] == 1e-3 and saved["preset"] == ""
    assert Config.from_dict(saved) == cfg


@pytest.mark.parametrize("flags", [["--fit_defaults_to_env=False"], ["--env_service=skip:sf_core/Corridor-v0"]])
def test_sample_factorys_defaults_stay_when_asked_or_when_the_envs_are_served(flags):
    cfg, _ = parse_args(["--env=sf_core/Corridor-v0", *flags])
    defaults = Config()
    assert cfg.env_fit == [] and cfg.learning_rate == defaults.learning_rate == 1e-4
    assert cfg.encoder_mlp_layers == defaults.encoder_mlp_layers == [512, 512]


def test_an_env_that_cannot_be_made_while_parsing_is_left_to_the_runner():
    cfg, _ = parse_args(["--env=NoSuchEnv-v0"])
    assert cfg.env_fit == [] and cfg.encoder_mlp_layers == [512, 512]


def test_a_preset_wins_over_the_fit():
    cfg, preset = parse_args(["--env=CartPole-v1"])
    assert preset == cfg.preset == "CartPole-v1" and cfg.env_fit == [] and cfg.learning_rate == 3e-3


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_small_custom_env_learns_with_no_model_or_learning_flag(tmp_path):
    """GuessTheSign (chance: 10 of 20) with Sample Factory's 512x512 MLP at 1e-4 stays near chance for 20k
    frames (10.2-10.8 of 20; 11.5-12 at 40k, seeds 1 and 2); with the fitted defaults it passes 16 by 12k-17k."""
    runs = {}
    for fitted, frames in ((True, 30_000), (False, 20_000)):
        experiment = f"fitted_{fitted}"
        result = launch.run(["--env=GuessTheSign-v0", "--env_module=tests.small_envs", f"--train_dir={tmp_path}",
                             f"--experiment={experiment}", f"--train_for_env_steps={frames}",
                             "--target_mean_return=16", "--seed=1", f"--fit_defaults_to_env={fitted}"], timeout=60)
        assert result.returncode == 0, result.stderr[-3000:]
        assert ("applied defaults fitted to the env's spaces" in result.stdout) is fitted
        runs[fitted] = read_summary(tmp_path, experiment)
    assert runs[True]["time_to_target"] is not None, runs[True]
    assert runs[False]["mean_return"] < 13, runs[False]
