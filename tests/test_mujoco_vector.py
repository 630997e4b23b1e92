"""MuJoCo ids stepped in batch (--env_vectorization=mujoco, envs/mujoco_vector.py): the same steps as gymnasium's
env bit for bit, which runs get the backend, and a run on it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from sf_core.cli.arguments import parse_args
from sf_core.config import ConfigError
from sf_core.envs.mujoco_vector import AntVectorEnv, make_mujoco_vector_env
from sf_core.envs.registry import EnvRegistry, registry_snapshot
from sf_core.envs.vector_backends import MujocoBackend, vector_backend
from tests import launch
from tests.conftest import extra
from tests.helpers import read_summary

extra("mujoco", "mujoco")

N = 6


# an episode limit that cuts some episodes and sees others end first (random humanoids fall within ~20 steps)
@pytest.mark.parametrize("env_id, obs_size, actions, limit", [
    ("Ant-v5", 105, 8, 60), ("Humanoid-v5", 348, 17, 22), ("HalfCheetah-v5", 17, 6, 60), ("Hopper-v5", 11, 3, 20),
    ("Walker2d-v5", 17, 6, 20)])
def test_a_batch_steps_as_gymnasiums_envs_bit_for_bit(env_id, obs_size, actions, limit):
    batch = make_mujoco_vector_env(env_id, N)
    batch.max_episode_steps = limit  # as gymnasium.make's max_episode_steps: episodes cut within the test
    singles = [gym.make(env_id, max_episode_steps=limit) for _ in range(N)]
    obs, _ = batch.reset(seed=7)
    assert obs.dtype == np.float64 and obs.shape == (N, obs_size)
    assert (obs == np.stack([env.reset(seed=7 + e)[0] for e, env in enumerate(singles)])).all()
    rng = np.random.default_rng(0)
    ends = {"terminated": 0, "truncated": 0}
    for t in range(400):
        scale = 3.0 if t % 5 == 0 else 1.0  # strong kicks now and then: the bodies fall over, episodes terminate
        action = np.clip(rng.uniform(-1, 1, (N, actions)) * scale, -1, 1).astype(np.float32)
        obs, rewards, terminated, truncated, info = batch.step(action)
        for e, env in enumerate(singles):
            single_obs, reward, term, trunc, _ = env.step(action[e])
            assert (rewards[e], terminated[e], truncated[e]) == (reward, term, trunc), (t, e)
            if term or trunc:
                ends["terminated" if term else "truncated"] += 1
                assert (info["final_obs"][e] == single_obs).all() and info["_final_obs"][e]
                single_obs, _ = env.reset()  # the next episode's start, drawn from the env's own generator
            assert (obs[e] == single_obs).all(), (t, e)
    assert ends["terminated"] >= (0 if env_id == "HalfCheetah-v5" else 3) and ends["truncated"] >= 3, ends
    batch.close()


def test_the_ant_of_other_arguments_is_not_taken_for_ant_v5():
    gym.register("AntWithoutForces-test", entry_point="gymnasium.envs.mujoco.ant_v5:AntEnv",
                 kwargs={"include_cfrc_ext_in_observation": False}, max_episode_steps=1000)
    try:
        with pytest.raises(ValueError, match=r"other arguments than the v5 id's defaults "
                                             r"\(include_cfrc_ext_in_observation is off\)"):
            AntVectorEnv("AntWithoutForces-test", 2)
    finally:
        gym.registry.pop("AntWithoutForces-test")


def test_auto_picks_the_mujoco_backend_for_ant_and_only_where_it_serves():
    def backend(env: str, flag: str = "auto", registry: EnvRegistry | None = None):
        cfg, _ = parse_args([f"--env={env}", f"--env_vectorization={flag}"])
        return vector_backend(cfg, registry or registry_snapshot(only=env))

    assert isinstance(backend("Ant-v5"), MujocoBackend)
    assert backend("Ant-v5", "none") is None
    assert backend("Pusher-v5") is None  # no batched step: one gymnasium env per env
    own = EnvRegistry({"Ant-v5": lambda name, cfg, ctx: gym.make("Ant-v5")})
    assert backend("Ant-v5", registry=own) is None  # a user's own factory for the id is theirs to step
    with pytest.raises(ConfigError, match=r"--env_vectorization=mujoco cannot serve env 'Pusher-v5': it serves the "
                                          r"MuJoCo ids with a batched step \(Ant-v5, Humanoid-v5, HalfCheetah-v5, "):
        backend("Pusher-v5", "mujoco")
    with pytest.raises(ValueError, match="does not render"):
        make_mujoco_vector_env("Ant-v5", 1, render_mode="rgb_array")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ant_trains_on_batched_envs_and_counts_their_episodes(tmp_path):
    result = launch.run(["--env=Ant-v5", "--num_workers=1", "--num_envs_per_worker=16", "--rollout=32",
                         "--batch_size=256", "--num_batches_per_epoch=2", "--num_epochs=2",
                         "--train_for_env_steps=8192", f"--train_dir={tmp_path}", "--experiment=ant", "--seed=1"],
                        timeout=100)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "one vector env (--env_vectorization=auto: the mujoco backend)" in result.stdout + result.stderr
    summary = read_summary(tmp_path, "ant")
    assert summary["frames"] >= 8192 and summary["samples_trained"] >= 8192
    # random ants fall over within a few hundred steps: episodes end and are counted, with finite returns
    assert summary["episodes"] >= 10 and np.isfinite(summary["mean_return"])
