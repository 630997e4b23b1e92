"""Atari through ale-py: names, preprocessing, whole-game statistics, presets, and a short training run
through the full pipeline (conv model, frame stack) followed by an evaluation with video.

ale-py is in the dev extra: these tests fail, rather than skip, when it is missing.
"""

import json
import sys

import numpy as np
import pytest

from sf_core.config import ConfigError
from sf_core.envs.atari import AreaResize, _area_matrix, ale_id, make_atari_env
from sf_core.envs.registry import EnvContext, EnvNotFoundError, make_env
from sf_core.cli.arguments import parse_args
from sf_core.run.presets import preset_for
from tests.conftest import extra
from tests.helpers import train

extra("ale_py", "atari")


class Cfg:
    env_frameskip = 4


def play_until_game_over(env, seed: int, max_steps: int = 5000):
    """Random actions until a step reports a finished game; returns the per-step records."""
    env.reset(seed=seed)
    steps = []
    for _ in range(max_steps):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        steps.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            if info.get("episode_return") is not None:
                return steps
            env.reset()
    raise AssertionError(f"no game ended within {max_steps} steps")


def test_names_resolve_to_ale_ids():
    assert ale_id("atari_pong") == "ALE/Pong-v5"
    assert ale_id("atari_breakout") == "ALE/Breakout-v5"
    assert ale_id("atari_space_invaders") == ale_id("atari_spaceinvaders") == "ALE/SpaceInvaders-v5"
    assert ale_id("atari_montezuma") == "ALE/MontezumaRevenge-v5"  # Sample Factory's spelling
    assert ale_id("ALE/Pong-v5") == "ALE/Pong-v5"
    with pytest.raises(EnvNotFoundError, match="unknown Atari game 'atari_pongg'"):
        make_env("atari_pongg", Cfg(), EnvContext(0, 0, 0))


def test_missing_ale_py_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # import ale_py now raises ImportError
    with pytest.raises(EnvNotFoundError, match=r"pip install -e '\.\[atari\]'"):
        make_env("atari_pong", Cfg(), EnvContext(0, 0, 0))


def test_area_resize_is_a_weighted_average():
    rows = _area_matrix(210, 84)
    np.testing.assert_allclose(rows.sum(1), 1.0, rtol=1e-6)  # every output pixel averages its span
    np.testing.assert_allclose(rows.sum(0), 84 / 210, rtol=1e-6)  # every source pixel counts equally
    resize = AreaResize((210, 160), (84, 84))
    assert (resize(np.full((210, 160), 77, np.uint8)) == 77).all()
    frame = np.random.default_rng(0).integers(0, 256, (210, 160), dtype=np.uint8)
    exact = _area_matrix(210, 84) @ frame.astype(np.float64) @ _area_matrix(160, 84).T
    assert np.abs(resize(frame).astype(np.float64) - exact).max() <= 0.5 + 1e-3


def test_training_env_episodic_life_clipped_rewards_whole_game_returns():
    env = make_env("atari_breakout", Cfg(), EnvContext(0, 0, 1))
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    obs, info = env.reset(seed=1)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and info["lives"] == 5
    assert (obs[0] == obs[-1]).all()  # the stack starts filled with the first frame
    steps = play_until_game_over(env, seed=1)
    lives_lost = [s for s in steps if s[2] and s[4]["episode_return"] is None]
    assert len(lives_lost) >= 4  # Breakout: 5 lives, each loss ends an episode for the learner
    assert {s[1] for s in steps} <= {-1.0, 0.0, 1.0}
    final_info = steps[-1][4]
    assert final_info["lives"] == 0 and final_info["episode_length"] >= len(lives_lost)
    env.close()


def test_an_env_made_with_its_seed_loads_the_rom_once_and_plays_as_one_seeded_at_reset(monkeypatch):
    """A worker's env is made with its seed (EnvContext.seed) and reset with it: ale-py's second ROM load (to
    apply the seed) is skipped, and the game, sticky actions included, is the one a reset(seed) would give."""
    from ale_py.env import AtariEnv

    loads = []
    original = AtariEnv.load_game
    monkeypatch.setattr(AtariEnv, "load_game", lambda self: (loads.append(1), original(self))[1])

    def frames(ctx: EnvContext | None, seed: int) -> np.ndarray:
        env = make_env("atari_pong", Cfg(), ctx) if ctx else make_env("atari_pong", Cfg(), EnvContext(0, 0, None))
        observations = [env.reset(seed=seed)[0]]
        rng = np.random.default_rng(0)
        for _ in range(200):
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            observations.append(env.reset()[0] if terminated or truncated else obs)
        env.close()
        return np.stack(observations)

    seeded_at_reset = frames(None, seed=7)
    assert len(loads) == 2  # made, then reloaded for the seed
    loads.clear()
    made_seeded = frames(EnvContext(0, 0, 7), seed=7)
    assert len(loads) == 1
    np.testing.assert_array_equal(made_seeded, seeded_at_reset)
    loads.clear()
    assert not np.array_equal(frames(EnvContext(0, 0, 7), seed=8), seeded_at_reset)  # another seed: reloaded
    assert len(loads) == 2


@pytest.mark.parametrize("sticky, same_game", [(0.0, True), (0.25, False)])
def test_sticky_actions_follow_the_flag(sticky: float, same_game: bool):
    """--repeat_action_probability reaches the emulator. Without sticky actions the game is the deterministic
    NoFrameskip-v4 one: two emulators seeded apart play the same frames for the same actions (no no-op starts
    here); with them, each repeats the previous action at frames of its own draw, and the games part."""
    cfg = parse_args(["--env=atari_pong", f"--repeat_action_probability={sticky}"])[0]

    def frames(seed: int) -> np.ndarray:
        env = make_atari_env("atari_pong", cfg, EnvContext(0, 0, seed), noop_max=0)
        assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(sticky)
        observations = [env.reset(seed=seed)[0]]
        actions = np.random.default_rng(0).integers(env.action_space.n, size=300)
        observations += [env.step(int(a))[0] for a in actions]
        env.close()
        return np.stack(observations)

    assert np.array_equal(frames(1), frames(2)) == same_game
    explicit = make_atari_env("atari_pong", cfg, EnvContext(0, 0, 1), repeat_action_probability=0.5)
    assert explicit.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.5)  # the factory's wins
    explicit.close()


def test_a_sticky_action_probability_outside_0_1_is_refused():
    with pytest.raises(ConfigError, match=r"--repeat_action_probability must be in \[0, 1\], got 1.5"):
        parse_args(["--env=atari_pong", "--repeat_action_probability=1.5"])


def test_evaluation_env_plays_whole_games_with_raw_rewards_and_renders():
    env = make_env("ALE/Breakout-v5", Cfg(), EnvContext(-1, 0, 2, render_mode="rgb_array", evaluation=True))
    env.reset(seed=2)
    frame = env.render()
    assert frame.shape == (210, 160, 3) and frame.dtype == np.uint8
    total, length = 0.0, 0
    while True:
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total, length = total + reward, length + 1
        if terminated or truncated:
            break
        assert length < 5000
    assert info["lives"] == 0  # no episode ended at a lost life
    assert info["episode_return"] == total  # raw Breakout scores, no clipping
    env.close()


def test_atari_presets_match_every_atari_name():
    assert preset_for("atari_pong")[0] == "atari_*"
    assert preset_for("atari_breakout")[1]["env_frameskip"] == 4
    assert preset_for("ALE/Pong-v5")[0] == "ALE/*"
    assert preset_for("CartPole-v1")[0] == "CartPole-v1"
    assert preset_for("atari")[0] is None
    cfg, preset = parse_args(["--env=atari_pong", "--num_workers=1"])
    assert preset == "atari_*" and cfg.num_workers == 1 and cfg.encoder_conv_architecture == "convnet_atari"
    assert cfg.exploration_loss_coeff == 0.01 and cfg.learning_rate == 2.5e-4


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_breakout_trains_through_full_pipeline_then_enjoy_with_video(tmp_path):
    code, summary = train(tmp_path, "--env=atari_breakout", "--num_workers=1", "--num_envs_per_worker=4",
                          "--rollout=32", "--batch_size=128", "--num_batches_per_epoch=1", "--num_epochs=1",
                          "--train_for_env_steps=5000", "--seed=1", "--report_interval=2")
    assert code == 0, summary
    assert summary["frames"] >= 5000  # env frames: 4 per agent step
    assert summary["policy_version"] >= 2 and summary["samples_trained"] >= 256
    with open(tmp_path / "exp" / "config.json") as f:
        assert json.load(f)["env_frameskip"] == 4  # the atari_* preset
    # whole games are logged: a random Breakout game lasts a few hundred agent steps over its 5 lives,
    # one life a few dozen
    assert summary["episodes"] >= 1, summary
    assert summary["mean_length"] >= 100, summary
    assert summary["mean_return"] >= 0

    import imageio.v2 as imageio

    import sf_core.enjoy

    code = sf_core.enjoy.main([f"--train_dir={tmp_path}", "--experiment=exp", "--max_num_episodes=1",
                               "--save_video=True", "--video_frames=30"])
    assert code == 0
    with open(tmp_path / "exp" / "eval_results.json") as f:
        results = json.load(f)
    assert results["episodes"] == 1 and results["lengths"][0] >= 100  # a whole game: all 5 lives
    reader = imageio.get_reader(str(tmp_path / "exp" / "replay.mp4"))
    try:
        assert reader.count_frames() == 30
        assert reader.get_data(0).shape == (210, 160, 3)
    finally:
        reader.close()
