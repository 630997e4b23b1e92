"""Flags: types, validation messages, presets under explicit flags, JSON round trip."""

import json

import pytest

from sf_core.config import Config, ConfigError, parse_args


def test_defaults_and_types():
    cfg, preset = parse_args(["--env=MyEnv-v0", "--encoder_mlp_layers", "32", "16", "--serial_mode=True"])
    assert preset is None
    assert cfg.encoder_mlp_layers == [32, 16]
    assert cfg.serial_mode is True
    assert isinstance(cfg.learning_rate, float)


def test_preset_applies_under_explicit_flags():
    cfg, preset = parse_args(["--env=CartPole-v1", "--learning_rate=0.01"])
    assert preset == "CartPole-v1"
    assert cfg.learning_rate == 0.01  # typed by the user: preset must not override
    assert cfg.encoder_mlp_layers == [64, 64]  # from the preset
    default = Config()
    assert cfg.num_envs_per_worker != default.num_envs_per_worker or cfg.rollout != default.rollout


@pytest.mark.parametrize("argv, message", [
    (["--env=CartPole-v1", "--num_workers=0"], "--num_workers must be at least 1"),
    (["--env=CartPole-v1", "--learning_rate=fast"], "invalid float value: 'fast'"),
    (["--env=CartPole-v1", "--serial_mode=maybe"], "expected a boolean"),
    (["--env=CartPole-v1", "--bogus_flag=1"], "unrecognized arguments: --bogus_flag=1"),
    (["--env=CartPole-v1", "--num_envs_per_worker=6", "--worker_num_splits=4"], "must be divisible by --worker_num_splits=4"),
    (["--env=CartPole-v1", "--batch_size=100", "--num_batches_per_epoch=1", "--rollout=32"], "divisible by --rollout=32"),
    (["--env=CartPole-v1", "--gamma=1.5"], "--gamma must be in [0, 1]"),
    (["--env=CartPole-v1", "--nonlinearity=swish"], "invalid choice: 'swish'"),
    ([], "--env is required"),
])
def test_bad_values_name_the_problem(argv, message):
    with pytest.raises(ConfigError) as err:
        parse_args(argv)
    assert message in str(err.value)


def test_config_json_round_trip():
    cfg, _ = parse_args(["--env=CartPole-v1", "--seed=3"])
    assert Config(**json.loads(cfg.to_json())) == cfg
