"""Atari games as one vector env per split (--env_vectorization=ale, envs/atari_vector.py): which names the
backend serves, the rows a split of Asterix games writes through the native vector runner against ale-py's own
vector env played with the same seed and actions, its frames against today's wrapper, and a short training run.

ale-py is in the dev extra: these tests fail, rather than skip, when it is missing.
"""

from __future__ import annotations

import functools
import sys

import gymnasium as gym
import numpy as np
import pytest

from sf_core.cli.arguments import parse_args
from sf_core.config import ConfigError
from sf_core.contracts.buffers import BufferLayout, TrajectoryBuffers
from sf_core.contracts.sample import SampleSpaces
from sf_core.envs.atari import make_atari_env
from sf_core.envs.registry import EnvContext, EnvNotFoundError, EnvRegistry, VectorEnvContext
from sf_core.envs.vector_backends import AleVectorBackend, vector_backend
from sf_core.machine.wiring import probe_spaces
from sf_core.sampling.native_vector_runner import NativeVectorRunner
from tests import launch
from tests.conftest import extra
from tests.helpers import read_summary

ale_py = extra("ale_py", "atari")

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
SHORT = "ALE/AsterixShort-v5"  # Asterix cut at 1000 frames (250 agent steps): games end both ways
N, ROWS, ROLLOUT, SEED, ACTIONS = 3, 300, 16, 5, 9


def config(env: str, *flags: str):
    cfg, _ = parse_args([f"--env={env}", "--env_vectorization=ale", "--num_workers=1", f"--num_envs_per_worker={N}",
                         "--worker_num_splits=1", f"--rollout={ROLLOUT}", f"--batch_size={ROLLOUT * N}",
                         "--fit_defaults_to_env=False", *flags])
    return cfg


@pytest.fixture
def short_asterix():
    """An ALE id of Asterix registered with a time limit of 1000 frames: the backend takes the id's emulator
    settings from its registration, as gymnasium.make does on the per-env path."""
    kwargs = dict(gym.spec("ALE/Asterix-v5").kwargs, max_num_frames_per_episode=1000)
    gym.register(SHORT, entry_point="ale_py.env:AtariEnv", kwargs=kwargs)
    yield SHORT
    del gym.registry[SHORT]


def test_the_ale_backend_serves_atari_names_only_by_name():
    backend, registry = AleVectorBackend(), EnvRegistry()
    assert backend.supports("atari_pong", registry) and backend.supports("ALE/Pong-v5", registry)
    assert not backend.supports("CartPole-v1", registry)
    # a factory registered under an Atari name shapes the env itself: the backend would not
    shadowed = EnvRegistry({"atari_pong_det": functools.partial(make_atari_env, repeat_action_probability=0.0)})
    assert not backend.supports("atari_pong_det", shadowed)
    assert isinstance(vector_backend(config("atari_pong"), registry), AleVectorBackend)
    assert vector_backend(config("atari_pong", "--env_vectorization=auto"), registry) is None  # not measured yet
    with pytest.raises(ConfigError) as caught:
        vector_backend(config("CartPole-v1"), registry)
    assert str(caught.value) == (
        "--env_vectorization=ale cannot serve env 'CartPole-v1': it serves atari_* names and ALE/... ids that no "
        "registered factory shapes; --env_vectorization=none steps one env at a time")


def test_an_unknown_game_or_a_missing_ale_py_is_named_as_on_the_per_env_path(monkeypatch):
    ctx = VectorEnvContext(0, 0, 1, None)
    with pytest.raises(EnvNotFoundError, match="unknown Atari game 'atari_pongg'"):
        AleVectorBackend().make("atari_pongg", config("atari_pongg"), ctx, EnvRegistry())
    monkeypatch.setitem(sys.modules, "ale_py", None)  # import ale_py now raises ImportError
    with pytest.raises(EnvNotFoundError, match=r"env 'atari_pong' is an Atari game, which needs ale-py \(.*\): "
                                               r"pip install -e '\.\[atari\]'"):
        AleVectorBackend().make("atari_pong", config("atari_pong"), ctx, EnvRegistry())


@pytest.mark.parametrize("sticky, actions_matter", [(0.0, True), (1.0, False)])
def test_sticky_actions_follow_the_flag(sticky: float, actions_matter: bool):
    """--repeat_action_probability reaches ale-py's emulators: at 1 every frame repeats the previous action (the
    no-op the game began with), so two action sequences play the same frames; at 0 each action is played."""
    cfg = config("atari_pong", f"--repeat_action_probability={sticky}")

    def frames(action_seed: int) -> np.ndarray:
        env = AleVectorBackend().make("atari_pong", cfg, VectorEnvContext(0, 0, N, None), EnvRegistry())
        observations = [env.reset(seed=SEED)[0]]
        rng = np.random.default_rng(action_seed)
        observations += [env.step(rng.integers(env.single_action_space.n, size=N))[0] for _ in range(100)]
        env.close()
        return np.stack(observations)

    assert (not np.array_equal(frames(0), frames(1))) == actions_matter


def test_the_probe_reads_the_spaces_of_the_per_env_path():
    spaces = probe_spaces(config("atari_pong", "--check_env=True"), EnvRegistry(), seed=0)
    assert spaces == (ATARI_OBS, gym.spaces.Discrete(6), 1)
    env = make_atari_env("atari_pong", config("atari_pong"), EnvContext(0, 0, 0))
    assert (env.observation_space, env.action_space) == spaces[:2]
    env.close()


def test_a_games_first_observation_is_the_one_todays_wrapper_gives():
    """Space Invaders' start screen stands still through the reset's no-ops, so the two paths' first observations
    show the same picture: the same grey levels, area-averaged to 84x84 (OpenCV's rounding against numpy's: at
    most 1 level apart), the stack filled with the first frame."""
    ctx = VectorEnvContext(0, 0, 2, None)
    env = AleVectorBackend().make("atari_space_invaders", config("atari_space_invaders"), ctx, EnvRegistry())
    obs, _ = env.reset(seed=3)
    assert env.single_observation_space == ATARI_OBS and obs.dtype == np.uint8 and obs.shape == (2, 4, 84, 84)
    today = make_atari_env("atari_space_invaders", config("atari_space_invaders"), EnvContext(0, 0, 3))
    expected, _ = today.reset(seed=3)
    today.close()
    difference = np.abs(obs[0].astype(int) - expected.astype(int))
    assert difference.max() <= 1 and (difference == 0).mean() > 0.999
    for _ in range(3):  # the stack moves on by one frame a step
        last = obs
        obs, *_ = env.step(np.zeros(2, dtype=np.int64))
        assert (obs[:, :3] == last[:, 1:]).all() and not (obs[:, 3] == last[:, 3]).all()
    env.close()


def raw_games(env_id: str, actions: np.ndarray) -> list[tuple]:
    """ale-py's own vector env with the backend's settings, but no life-loss signal and unclipped rewards,
    seeded and played as the runner's split: per row (obs, raw rewards, terminated, truncated, final obs, lives
    lost on the step): games end only when they are over or cut by the time limit."""
    spec = gym.spec(env_id)
    env = ale_py.AtariVectorEnv(spec.kwargs["game"], N, num_threads=1, repeat_action_probability=0.25,
                                max_num_frames_per_episode=spec.kwargs["max_num_frames_per_episode"],
                                autoreset_mode="SameStep", reward_clipping=False, life_loss_info=False)
    obs, info = env.reset(seed=SEED)
    rows, lives = [], info["lives"]
    for t in range(ROWS):
        next_obs, reward, terminated, truncated, info = env.step(actions[t])
        final = info["final_obs"].copy() if "final_obs" in info else None
        life_lost = ~(terminated | truncated) & (info["lives"] < lives)
        rows.append((obs, reward, terminated, truncated, final, life_lost))
        obs, lives = next_obs, info["lives"]
    env.close()
    return rows


def split_rows(env_id: str, actions: np.ndarray) -> tuple[list[tuple], list[tuple], float]:
    """The rows a split of N games writes through NativeVectorRunner: per row (obs, reward, done, truncated,
    final obs), and the episodes it recorded, (return, length) in order; and --reward_scale."""
    cfg = config(env_id, f"--seed={SEED}")
    layout = BufferLayout.from_config(cfg)
    buffers = TrajectoryBuffers(layout, SampleSpaces(ATARI_OBS, gym.spaces.Discrete(ACTIONS)))
    runner = NativeVectorRunner(cfg, 0, 0, EnvRegistry(), buffers, layout, seed=SEED)
    rows = []
    runner.reset(runner.take_free_slot())
    for t in range(ROWS):
        if runner.trajectory_complete():
            old = runner.slot
            assert runner.next_slot()
            runner.release(old % layout.sets_per_split)
        slot, row = runner.slot, runner.t
        runner.actions[slot, row] = actions[t]
        runner.step()
        cut = runner.truncated[slot, row].copy()
        rows.append((runner.obs[slot, row].copy(), runner.rewards[slot, row].copy(), runner.dones[slot, row].copy(),
                     cut, runner.final_obs.copy()))
        assert not runner.inactive[slot, row].any()  # SAME_STEP: every row is played
    episodes = [(ret, length) for ret, length, *_ in runner.finished_episodes]
    runner.envs[0].close()
    return rows, episodes, cfg.reward_scale


@pytest.mark.slow  # six ROM loads on each side (0.2 s each) and 900 games' steps: a few seconds
@pytest.mark.timeout(120)
def test_a_split_of_atari_games_writes_the_rows_of_the_same_games_with_whole_game_returns(short_asterix):
    actions = np.random.default_rng(0).integers(0, ACTIONS, (ROWS, N))
    raw = raw_games(short_asterix, actions)
    rows, episodes, scale = split_rows(short_asterix, actions)
    expected, game = [], np.zeros((N, 2))
    for t, (row, raw_row) in enumerate(zip(rows, raw)):
        obs, reward, done, cut, final = row
        raw_obs, raw_reward, raw_term, raw_trunc, raw_final, life_lost = raw_row
        game_over = raw_term | raw_trunc
        assert obs.shape == (N, 4, 84, 84) and obs.dtype == np.uint8
        for e in range(N):  # the frames of the same games; before a game's first frame that frame (ale-py: zeros)
            first = int(np.argmax(raw_obs[e].reshape(4, -1).any(1)))
            assert (obs[e, first:] == raw_obs[e, first:]).all() and (obs[e, :first] == raw_obs[e, first]).all()
            if t and not rows[t - 1][2][e] | rows[t - 1][3][e] | (first > 0):
                assert (obs[e, :3] == rows[t - 1][0][e, 1:]).all()  # the stack moves on by one frame
        np.testing.assert_allclose(reward, np.sign(raw_reward) * scale)  # clipped for the learner
        assert (done == (raw_term | life_lost)).all()  # a lost life ends the learner's episode
        assert (cut == (raw_trunc & ~life_lost)).all()
        for e in np.flatnonzero(cut):
            assert (final[e] == raw_final[e]).all()  # the cut game's last frames, for the bootstrap
        game += np.stack([raw_reward, np.ones(N)], 1)
        for e in np.flatnonzero(game_over):
            expected.append((float(game[e, 0]), int(game[e, 1])))
            game[e] = 0
    assert episodes == expected  # whole games (all lives, unclipped rewards), in the order they ended
    over, cut = sum(r[2].sum() for r in raw), sum(r[3].sum() for r in raw)
    assert over >= 1 and cut >= 1  # games ended with the last life and by the time limit
    assert sum(r[5].sum() for r in raw) >= 5  # and lives were lost in between
    assert max(r[1].max() for r in raw) > 1  # scores the clipped rewards would not give


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_training_on_ale_vector_envs_counts_frames_and_records_whole_games(tmp_path):
    result = launch.run(["--env=atari_breakout", "--env_vectorization=ale", "--num_workers=1",
                         "--num_envs_per_worker=4", "--rollout=32", "--batch_size=128", "--num_batches_per_epoch=1",
                         "--num_epochs=1", "--train_for_env_steps=6000", f"--train_dir={tmp_path}",
                         "--experiment=ale", "--seed=1"], timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "one vector env (--env_vectorization=ale: the ale backend)" in result.stdout + result.stderr
    summary = read_summary(tmp_path, "ale")
    assert summary["frames"] >= 6000  # emulator frames: 4 an agent step (the atari_* preset's frameskip)
    # whole games, over their 5 lives: a random Breakout game lasts a few hundred agent steps, one life a few dozen
    assert summary["episodes"] >= 1 and summary["mean_length"] >= 100, summary
