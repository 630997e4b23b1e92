"""A split that is one natively vectorized env (--env_vectorization): the rows it writes, against the same env
stepped as single envs; the backends and which one a run gets; a user's VectorEnv wherever one env is played."""

from __future__ import annotations

import functools
import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import sf_core.train
from sf_core.algo.observations import PackedObs
from sf_core.cli.arguments import parse_args
from sf_core.config import _FIELDS, ConfigError
from sf_core.contracts.buffers import BufferLayout, TrajectoryBuffers
from sf_core.contracts.sample import SampleSpaces
from sf_core.envs.env_check import EnvContractError
from sf_core.envs.registry import EnvContext, EnvRegistry, VectorEnvContext, registry_snapshot
from sf_core.envs.vector_backends import CHOICES, GymnasiumBackend, UserBackend, vector_backend
from sf_core.envs.vector_of_one import VectorOfOne
from sf_core.machine.wiring import probe_spaces
from sf_core.sampling.native_vector_runner import NativeVectorRunner
from sf_core.sampling.vector_env_runner import VectorEnvRunner
from tests import launch
from tests.helpers import read_summary
from tests.vector_envs import OBS_SPACE, Corridor, VectorCorridor

N, ROLLOUT, REAL_STEPS = 4, 16, 40
NAME = "Corridor-test"


def config(*flags: str):
    cfg, _ = parse_args([f"--env={NAME}", "--num_workers=1", f"--num_envs_per_worker={N}", "--worker_num_splits=1",
                         f"--rollout={ROLLOUT}", f"--batch_size={ROLLOUT * N}", "--fit_defaults_to_env=False", *flags])
    return cfg


def make_runner(kind, registry: EnvRegistry, flag: str):
    cfg = config(f"--env_vectorization={flag}")
    layout = BufferLayout.from_config(cfg)
    buffers = TrajectoryBuffers(layout, SampleSpaces(OBS_SPACE, gym.spaces.Discrete(2)))
    return kind(cfg, 0, 0, registry, buffers, layout, seed=0)


def drive(runner, rows: int, actions: np.ndarray):
    """Step `rows` rows, each env taking its next action of `actions` [N, K] on every row it acts on (slots
    turned over as a worker does). Per env: its steps (obs, action, reward, done, truncated, final obs or None)
    and its finished episodes (return, length); and every row's (inactive, reward, done, truncated, obs)."""
    steps, episodes, rows_seen = [[] for _ in range(N)], [[] for _ in range(N)], []
    taken = np.zeros(N, dtype=np.int64)
    runner.reset(runner.take_free_slot())
    for _ in range(rows):
        if runner.trajectory_complete():
            old = runner.slot
            assert runner.next_slot()
            runner.release(old % runner.layout.sets_per_split)
        slot, t = runner.slot, runner.t
        acting = ~runner.inactive[slot, t]
        runner.actions[slot, t] = actions[np.arange(N), taken]
        before = len(runner.finished_episodes)
        has_truncation = runner.step()
        done, cut = runner.dones[slot, t], runner.truncated[slot, t]
        assert has_truncation == cut.any()
        ended = np.flatnonzero(acting & (done | cut))
        assert len(runner.finished_episodes) - before == len(ended)
        for e, episode in zip(ended, runner.finished_episodes[before:]):
            episodes[e].append((round(episode[0], 6), episode[1]))
        for e in np.flatnonzero(acting):
            steps[e].append((runner.obs[slot, t, e].tolist(), int(runner.actions[slot, t, e]),
                             round(float(runner.rewards[slot, t, e]), 6), bool(done[e]), bool(cut[e]),
                             runner.final_obs[e].tolist() if cut[e] else None))
        rows_seen.append((~acting, runner.rewards[slot, t].copy(), done.copy(), cut.copy(), runner.obs[slot, t].copy()))
        taken += acting
    return steps, episodes, rows_seen


def single_env_run(actions: np.ndarray):
    registry = EnvRegistry({NAME: lambda name, cfg, ctx: Corridor()})
    steps, episodes, _ = drive(make_runner(VectorEnvRunner, registry, "none"), REAL_STEPS, actions)
    return steps, episodes


def vector_env_run(mode: AutoresetMode, actions: np.ndarray):
    registry = EnvRegistry({NAME: lambda name, cfg, ctx: VectorCorridor(ctx.num_envs, mode)}, vectorized={NAME})
    runner = make_runner(NativeVectorRunner, registry, "auto")
    return drive(runner, 64, actions)


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_a_vector_env_split_writes_the_rows_and_episodes_of_the_same_envs_stepped_alone(mode):
    actions = (np.random.default_rng(5).random((N, 64)) < 0.65).astype(np.int64)
    single_steps, single_episodes = single_env_run(actions)
    steps, episodes, rows = vector_env_run(mode, actions)
    for e in range(N):
        assert len(steps[e]) >= REAL_STEPS
        assert steps[e][:REAL_STEPS] == single_steps[e]  # obs, action, reward, done, truncated, final obs
        assert episodes[e][:len(single_episodes[e])] == single_episodes[e]  # returns and lengths
    flags = [s[3:5] for e in range(N) for s in single_steps[e]]
    assert (True, False) in flags and (False, True) in flags  # episodes ended both ways, some cut by the limit
    gaps = [(t, e) for t, row in enumerate(rows) for e in np.flatnonzero(row[0])]
    if mode != AutoresetMode.NEXT_STEP:
        assert not gaps  # the env hands over the next episode's first observation on the step that ends one
        return
    # NEXT_STEP: the row after an episode's end holds its last observation, inactive; its step (the env's
    # reset) stores reward 0 and a done, and the next row is active again
    assert len(gaps) == sum(len(e) for e in episodes)
    for t, e in gaps:
        inactive, reward, done, cut, obs = rows[t]
        assert reward[e] == 0 and done[e] and not cut[e]
        assert rows[t - 1][2][e] or rows[t - 1][3][e]  # the row before ended an episode
        assert not rows[t + 1][0][e] if t + 1 < len(rows) else True
        if rows[t - 1][2][e]:  # terminated at the goal: the last observation is the goal cell
            assert obs[e].argmax() == 7
    assert any(t % ROLLOUT == 0 for t, _ in gaps)  # a waiting row carried into a new slot as its row 0


def test_a_vector_env_that_returns_a_batch_of_the_wrong_size_is_named():
    class Short(VectorCorridor):
        def step(self, actions):
            obs, *rest = super().step(actions)
            return (obs[:-1], *rest)

    registry = EnvRegistry({NAME: lambda name, cfg, ctx: Short(ctx.num_envs)}, vectorized={NAME})
    runner = make_runner(NativeVectorRunner, registry, "user")
    runner.reset(runner.take_free_slot())
    with pytest.raises(EnvContractError) as caught:
        runner.step()
    assert str(caught.value) == (
        f"env '{NAME}' (worker 0, split 0, a vector env of 4) broke the gymnasium VectorEnv API: step() must "
        f"return a batch of observations of shape (4, 8), got shape (3, 8)")


# ------------------------------------------------------------------------------------------ backends
def test_auto_picks_a_native_vector_env_where_one_exists_and_none_elsewhere():
    user = EnvRegistry({NAME: lambda name, cfg, ctx: VectorCorridor(ctx.num_envs)}, vectorized={NAME})
    assert isinstance(vector_backend(config(), user), UserBackend)
    cartpole = config("--env=CartPole-v1")
    assert isinstance(vector_backend(cartpole, EnvRegistry()), GymnasiumBackend)
    assert vector_backend(config("--env=Pendulum-v1"), EnvRegistry()) is None
    assert vector_backend(config("--env=CartPole-v1", "--env_vectorization=none"), EnvRegistry()) is None
    assert vector_backend(config("--env=CartPole-v1", "--batched_sampling=False"), EnvRegistry()) is None
    # a factory registered for a gymnasium id shapes the env: gymnasium's vector entry point would not
    shadowed = EnvRegistry({"CartPole-v1": lambda name, cfg, ctx: gym.make("CartPole-v1")})
    assert vector_backend(cartpole, shadowed) is None
    assert set(_FIELDS["env_vectorization"].metadata["choices"]) == set(CHOICES)  # the flag offers every backend


def test_the_gymnasium_backend_keeps_each_ids_time_limit():
    for env_id, limit in (("CartPole-v0", 200), ("CartPole-v1", 500)):
        env = GymnasiumBackend().make(env_id, None, VectorEnvContext(0, 0, 3, None), EnvRegistry())
        assert env.num_envs == 3 and env.unwrapped.max_episode_steps == limit == gym.spec(env_id).max_episode_steps
        env.close()


def test_a_backend_that_cannot_serve_the_env_is_a_config_error():
    with pytest.raises(ConfigError) as caught:
        vector_backend(config("--env=Pendulum-v1", "--env_vectorization=gymnasium"), EnvRegistry())
    assert str(caught.value) == (
        "--env_vectorization=gymnasium cannot serve env 'Pendulum-v1': it serves gymnasium ids registered with a "
        "vector_entry_point, such as CartPole-v1; --env_vectorization=none steps one env at a time")
    with pytest.raises(ConfigError, match="--env_vectorization=user cannot serve env 'CartPole-v1': it serves envs "
                                          r"registered with register_env\(name, factory, vectorized=True\)"):
        vector_backend(config("--env=CartPole-v1", "--env_vectorization=user"), EnvRegistry())
    with pytest.raises(ConfigError, match="which --batched_sampling=False"):
        config("--env=CartPole-v1", "--env_vectorization=gymnasium", "--batched_sampling=False")
    with pytest.raises(ConfigError, match=r"which --env_service \(envs on env servers\) rules out"):
        config("--env=CartPole-v1", "--env_vectorization=gymnasium", "--env_service=skip:CartPole-v1")


def test_training_with_a_backend_that_cannot_serve_the_env_exits_2_before_anything_starts(tmp_path, capsys):
    code = sf_core.train.main([f"--train_dir={tmp_path}", "--experiment=x", "--env=Pendulum-v1",
                               "--env_vectorization=gymnasium", "--serial_mode=True"])
    assert code == 2
    assert "--env_vectorization=gymnasium cannot serve env 'Pendulum-v1'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ one env at a time
def test_a_vectorized_registration_travels_and_plays_one_env_like_the_single_env():
    import tests.vector_envs  # noqa: F401  (registers VectorCorridor-v0)

    snapshot = pickle.loads(pickle.dumps(registry_snapshot(only="VectorCorridor-v0")))
    assert snapshot.vectorized == {"VectorCorridor-v0"}
    for mode in AutoresetMode:
        one = VectorOfOne(VectorCorridor(1, mode))
        alone = Corridor()
        assert one.observation_space == alone.observation_space and one.action_space == alone.action_space
        played = [env.reset(seed=3)[0].tolist() for env in (one, alone)]
        for action in [1, 0, 0, 0, 1, 0, 0, 1, 1, 1, 1]:
            results = [env.step(action) for env in (one, alone)]
            assert results[0][0].tolist() == results[1][0].tolist() and results[0][1:] == results[1][1:]
            if results[1][2] or results[1][3]:
                played += [env.reset()[0].tolist() for env in (one, alone)]
        assert played[0::2] == played[1::2]
    env = snapshot.make("VectorCorridor-v0", None, EnvContext(0, 0, 0))
    assert isinstance(env, VectorOfOne)


def test_the_probe_reads_a_vector_envs_single_spaces():
    registry = EnvRegistry({NAME: lambda name, cfg, ctx: VectorCorridor(ctx.num_envs)}, vectorized={NAME})
    assert probe_spaces(config(), registry, seed=0) == (OBS_SPACE, gym.spaces.Discrete(2), 1)
    assert probe_spaces(config("--env=CartPole-v1"), EnvRegistry(), seed=0)[0] == gym.spec(
        "CartPole-v1").make().observation_space


def test_a_batch_of_structured_observations_packs_as_each_row_would():
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (2, 3, 3), np.uint8), "pos": gym.spaces.Discrete(5),
                             "v": gym.spaces.Box(-1.0, 1.0, (3,), np.float64)})
    packed = PackedObs(space)
    batch = gym.vector.utils.batch_space(space, 4)
    batch.seed(0)
    obs = batch.sample()
    out, rows = np.zeros((4, packed.nbytes), np.uint8), np.zeros((4, packed.nbytes), np.uint8)
    packed.pack_batch_into(obs, out)
    for e in range(4):
        packed.pack_into({key: value[e] for key, value in obs.items()}, rows[e])
    assert (out == rows).all()


# ------------------------------------------------------------------------------------------ training
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_cartpole_with_gymnasiums_vector_env_solves_it(tmp_path):
    result = launch.run(["--env=CartPole-v1", "--env_vectorization=gymnasium", "--target_mean_return=475",
                         "--train_for_seconds=90", f"--train_dir={tmp_path}", "--experiment=vec", "--seed=1"],
                        timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(tmp_path, "vec")
    assert summary["time_to_target"] is not None, (summary.get("mean_return"), summary.get("frames"))


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("env", ["VectorCorridor-v0", "Corridor1-v0"])
def test_a_users_vector_env_trains_to_the_return_of_the_same_env_written_single(env, tmp_path):
    result = launch.run([f"--env={env}", "--env_module=tests.vector_envs", "--num_envs_per_worker=16",
                         "--rollout=16", "--batch_size=512", "--encoder_mlp_layers", "64", "--learning_rate=0.001",
                         "--target_mean_return=1.4", "--train_for_seconds=60", f"--train_dir={tmp_path}",
                         "--experiment=corridor", "--seed=3"], timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("one vector env" in result.stdout + result.stderr) == (env == "VectorCorridor-v0")
    summary = read_summary(tmp_path, "corridor")
    assert summary["time_to_target"] is not None, (summary.get("mean_return"), summary.get("frames"))
