"""MuJoCo (gymnasium[mujoco], in the dev extra): presets, construction, headless rendering, a short run."""

import json
import os

import gymnasium as gym
import numpy as np
import pytest

from sf_core.envs.registry import EnvContext, make_env
from sf_core.cli.arguments import parse_args
from tests.conftest import extra
from tests.helpers import train

extra("mujoco", "mujoco")

MUJOCO_IDS = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]


@pytest.mark.parametrize("env_id", MUJOCO_IDS)
def test_presets_and_spaces(env_id):
    cfg, preset = parse_args([f"--env={env_id}"])
    assert preset == env_id  # each of these has a preset of its own
    assert cfg.normalize_input and cfg.normalize_returns and cfg.nonlinearity == "tanh"
    assert cfg.train_for_env_steps == 1_000_000  # the budget the published scores are quoted at
    env = make_env(env_id, cfg, EnvContext(0, 0, 0))
    assert isinstance(env.action_space, gym.spaces.Box) and len(env.observation_space.shape) == 1
    obs, _ = env.reset(seed=0)
    assert np.isfinite(obs).all()
    env.close()


def test_rgb_array_renders_without_a_display(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    had_backend = "MUJOCO_GL" in os.environ
    try:
        env = make_env("HalfCheetah-v5", None, EnvContext(-1, 0, 0, render_mode="rgb_array", evaluation=True))
        env.reset(seed=0)
        frame = env.render()
        assert frame.shape[2] == 3 and frame.dtype == np.uint8 and frame.std() > 0
        env.close()
    finally:
        if not had_backend:
            os.environ.pop("MUJOCO_GL", None)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_halfcheetah_trains_a_few_thousand_steps(tmp_path):
    code, summary = train(tmp_path, "--env=HalfCheetah-v5", "--train_for_env_steps=4096", "--seed=1")
    assert code == 0, summary
    assert summary["frames"] >= 4096 and summary["samples_trained"] >= 2048 and summary["policy_version"] >= 1
    with open(tmp_path / "exp" / "config.json") as f:
        config = json.load(f)
    assert config["async_rl"] is False and config["num_epochs"] == 10  # the HalfCheetah-v5 preset
