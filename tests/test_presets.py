"""Every classic-control preset solves its env with no flag but the target: the command a newcomer types."""

from __future__ import annotations

import gymnasium as gym
import pytest

from sf_core.cli.arguments import parse_args
from sf_core.config import ConfigError
from sf_core.run.presets import OTHER_VERSIONS, PRESETS, VERIFIED, family_of, preset_for
from tests import launch
from tests.conftest import extra
from tests.helpers import read_summary

# env -> (the usual "solved" mean return, a wall-clock bound for this 2-core box with room for a loaded CI)
SOLVED = {"CartPole-v1": (475.0, 90), "Acrobot-v1": (-100.0, 150), "Pendulum-v1": (-200.0, 240)}


def test_every_verified_env_has_a_preset_and_the_classic_ones_are_tested():
    assert all(preset_for(env).values for env in VERIFIED)
    assert set(SOLVED) <= set(VERIFIED)


@pytest.mark.parametrize("other, env", sorted(OTHER_VERSIONS.items()))
def test_another_version_gets_a_preset_only_where_its_spaces_are_the_presets_envs(other, env):
    if env != "CartPole-v1":
        extra("mujoco", "mujoco")
    made = [gym.make(name) for name in (other, env)]
    try:
        assert made[0].observation_space == made[1].observation_space
        assert made[0].action_space == made[1].action_space
    finally:
        for instance in made:
            instance.close()
    match = preset_for(other, "PPO")
    assert (match.key, match.how) == (env, "version") and match.values == preset_for(env, "PPO").values


def test_another_version_says_which_preset_it_got_and_that_a_flag_typed_wins():
    lines = []
    cfg, preset = parse_args(["--env=HalfCheetah-v4", "--learning_rate=0.01"], announce=lines.append)
    assert preset == cfg.preset == "HalfCheetah-v5"
    assert cfg.learning_rate == 0.01 and cfg.num_epochs == 10 and cfg.nonlinearity == "tanh"
    assert lines[0].startswith("applied the preset of HalfCheetah-v5, made for that version: HalfCheetah-v4 has "
                               "the same spaces (flags you pass override it)")


def test_a_version_not_known_to_match_gets_no_preset_and_a_line_naming_the_one_that_has_it():
    lines = []
    cfg, preset = parse_args(["--env=Pendulum-v0"], announce=lines.append)
    assert preset is None and cfg.preset == "" and cfg.learning_rate == 1e-4
    assert cfg.env_fit == []  # left to the preset it is pointed to, not fitted
    assert lines == ["no preset for Pendulum-v0; Pendulum-v1 has one, not applied: Pendulum-v0's spaces are not "
                     "known to match its (python -m sf_core.train --env=Pendulum-v1 --help shows its values)"]
    assert preset_for("MyEnv-v1").how == "none"


@pytest.mark.parametrize("env", ["InvertedPendulum-v5", "Pusher-v5", "Ant-v4", "Humanoid-v4"])
def test_a_mujoco_id_without_a_preset_of_its_own_gets_the_familys(env):
    lines = []
    cfg, preset = parse_args([f"--env={env}", "--num_epochs=3"], announce=lines.append)
    assert preset == cfg.preset == "MuJoCo" and family_of(env) == "MuJoCo"
    assert cfg.normalize_input and cfg.train_for_env_steps == PRESETS["MuJoCo"]["train_for_env_steps"]
    assert cfg.num_epochs == 3  # typed flags still win
    assert lines[0].startswith(f"applied the MuJoCo preset, made for every id of that family ({env} has no preset")


def test_hopper_and_walker2d_collect_one_dataset_while_the_learner_trains_on_the_one_before():
    for env in ("Hopper-v5", "Walker2d-v5", "Hopper-v4"):
        cfg, preset = parse_args([f"--env={env}"], announce=lambda line: None)
        assert preset in ("Hopper-v5", "Walker2d-v5") and cfg.datasets_ahead() == 1
        assert cfg.num_epochs == PRESETS["MuJoCo"]["num_epochs"]  # the family's values otherwise
    assert parse_args(["--env=Ant-v5"], announce=lambda line: None)[0].datasets_ahead() == 0


def test_ant_and_humanoid_train_their_critic_while_the_next_dataset_is_collected():
    for env in ("Ant-v5", "Humanoid-v5"):  # their v4 ids observe other quantities: the family's preset
        cfg, preset = parse_args([f"--env={env}"], announce=lambda line: None)
        assert preset == env and cfg.split_actor_critic and cfg.values_at_learner()
        assert cfg.datasets_ahead() == 0 and cfg.num_epochs == PRESETS["MuJoCo"]["num_epochs"]
    with pytest.raises(ConfigError, match="pass --split_actor_critic=False with a recurrent core"):
        parse_args(["--env=Ant-v5", "--use_rnn=True"], announce=lambda line: None)[0].validate()
    assert parse_args(["--env=Ant-v5", "--use_rnn=True", "--split_actor_critic=False"],
                      announce=lambda line: None)[0].use_rnn


def test_ant_takes_half_the_sgd_steps_at_twice_the_learning_rate_and_humanoid_the_familys():
    family = PRESETS["MuJoCo"]
    ant, _ = parse_args(["--env=Ant-v5"], announce=lambda line: None)
    humanoid, _ = parse_args(["--env=Humanoid-v5"], announce=lambda line: None)
    dataset = family["batch_size"] * family["num_batches_per_epoch"]
    assert ant.batch_size * ant.num_batches_per_epoch == dataset == ant.num_workers * ant.num_envs_per_worker \
        * ant.rollout  # the same dataset, in half as many minibatches
    assert ant.num_batches_per_epoch * 2 == family["num_batches_per_epoch"]
    assert ant.learning_rate == 2 * family["learning_rate"] and ant.lr_schedule == family["lr_schedule"]
    assert (humanoid.batch_size, humanoid.learning_rate) == (family["batch_size"], family["learning_rate"])


def test_half_cheetah_s_learner_takes_two_threads_where_sampling_waits_for_it_and_the_others_one():
    cheetah, _ = parse_args(["--env=HalfCheetah-v5"], announce=lambda line: None)
    assert cheetah.learner_threads() == 2 and cheetah.torch_threads == 1 and cheetah.datasets_ahead() == 0
    for env in ("Hopper-v5", "Ant-v5", "CartPole-v1"):  # the learner trains while sampling, or its steps are small
        assert parse_args([f"--env={env}"], announce=lambda line: None)[0].learner_threads() == 1


def test_swimmer_gets_the_familys_values_with_a_long_horizon_and_its_older_version_too():
    for env in ("Swimmer-v5", "Swimmer-v4"):
        cfg, preset = parse_args([f"--env={env}"], announce=lambda line: None)
        assert preset == "Swimmer-v5" and cfg.gamma == 0.9999 and cfg.normalize_input
        assert cfg.num_epochs == PRESETS["MuJoCo"]["num_epochs"]
    assert parse_args(["--env=Hopper-v5"], announce=lambda line: None)[0].gamma == 0.99


def test_inverted_double_pendulum_gets_the_familys_values_with_a_lower_learning_rate():
    cfg, preset = parse_args(["--env=InvertedDoublePendulum-v5"], announce=lambda line: None)
    assert preset == "InvertedDoublePendulum-v5" and cfg.learning_rate == 1e-4
    assert cfg.num_epochs == PRESETS["MuJoCo"]["num_epochs"] and cfg.normalize_input
    # v4 observes 11 quantities where v5 observes 9: the family's values, not v5's
    cfg, preset = parse_args(["--env=InvertedDoublePendulum-v4"], announce=lambda line: None)
    assert preset == "MuJoCo" and cfg.learning_rate == PRESETS["MuJoCo"]["learning_rate"]


def test_a_preset_has_values_of_its_own_for_vector_envs_which_the_console_names():
    lines: list[str] = []
    cfg, _ = parse_args(["--env=CartPole-v1"], announce=lines.append)
    assert cfg.num_envs_per_worker == 256 and "with its values for vector envs" in lines[0]
    lines.clear()
    cfg, _ = parse_args(["--env=CartPole-v1", "--env_vectorization=none"], announce=lines.append)
    assert cfg.num_envs_per_worker == 64 and "vector" not in lines[0]
    cfg, _ = parse_args(["--env=CartPole-v1", "--num_envs_per_worker=32"])  # a flag typed still wins
    assert cfg.num_envs_per_worker == 32
    assert preset_for("Acrobot-v1", vectorized=True) == preset_for("Acrobot-v1")  # none of its own


def test_an_env_outside_every_family_gets_none():
    assert family_of("CartPole-v1") is None and family_of("not-an-env") is None
    assert preset_for("HalfCheetah-v5").how == "exact"  # an env's own preset wins over its family's


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("env", sorted(SOLVED))
def test_a_classic_control_preset_solves_its_env_with_no_flags(env, tmp_path):
    target, seconds = SOLVED[env]
    result = launch.run([f"--env={env}", f"--target_mean_return={target:g}", f"--train_for_seconds={seconds}",
                         f"--train_dir={tmp_path}", "--experiment=preset", "--seed=1"], timeout=seconds + 60)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(tmp_path, "preset")
    assert summary["time_to_target"] is not None, (env, summary.get("mean_return"), summary.get("frames"))
    assert summary["mean_return_at_target"] >= target
