"""The env contract (envs/env_check.py): each rule, valid envs that keep it, a worker's env that breaks it
later, and what `python -m sf_core.train` prints for both."""

import textwrap
import time

import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch

from sf_core.cli.arguments import parse_args
from sf_core.contracts.buffers import BufferLayout, TrajectoryBuffers
from sf_core.contracts.sample import SampleSpaces
from sf_core.envs.env_check import EnvCheckError, EnvContractError, check_env
from sf_core.envs.multi_agent import SingleAgentAdapter
from sf_core.envs.nim import Nim
from sf_core.envs.registry import EnvContext, EnvRegistry
from sf_core.envs.relay_game import RelayGame
from sf_core.machine.wiring import supported_spaces
from sf_core.sampling.nonbatched_env_runner import NonBatchedEnvRunner
from sf_core.sampling.vector_env_runner import VectorEnvRunner
from tests import launch
from tests.image_envs import MinimapDictEnv


class Valid(gym.Env):
    """A 4-float observation, two actions, episodes of 20 steps; `Broken` subclasses break one rule each."""

    def __init__(self, size: int = 4, dtype=np.float32, space_dtype=np.float32):
        self.observation_space = gym.spaces.Box(0, 1, (size,), space_dtype)
        self.action_space = gym.spaces.Discrete(2)
        self.size, self.dtype, self.t = size, dtype, 0

    def _obs(self):
        return np.zeros(self.size, self.dtype)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 20, {}


class WrongShape(Valid):
    def step(self, action):
        _, *rest = super().step(action)
        return (np.zeros(5, np.float32), *rest)


class ArrayReward(Valid):
    def step(self, action):
        obs, reward, *rest = super().step(action)
        return (obs, np.array([reward]), *rest)


class ResetObsOnly(Valid):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed)[0]


class FourTuple(Valid):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, info


class InfoNone(Valid):
    def step(self, action):
        return (*super().step(action)[:4], None)


class IntFlags(Valid):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, int(terminated), truncated, info


class NoSeed(Valid):
    def reset(self):
        return super().reset()


def contract_error(env, name="Broken-v0", agents=None) -> str:
    with pytest.raises(EnvContractError) as caught:
        check_env(env, name, seed=0, agents=agents, supported=supported_spaces)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("env, rule", [
    (WrongShape(), "step() returned an observation that has shape (5,), but the observation space "
                   "Box(0.0, 1.0, (4,), float32) has shape (4,)"),
    (ArrayReward(), "step() must return a reward that is a real scalar (a python number or a numpy scalar), "
                    "got a numpy.ndarray of shape (1,)"),
    (ResetObsOnly(), "reset() must return (obs, info), got a numpy.ndarray of shape (4,)"),
    (FourTuple(), "step() must return (obs, reward, terminated, truncated, info), got a tuple of 4"),
    (InfoNone(), "step() must return an info that is a dict, got None"),
    (IntFlags(), "step() must return terminated as a bool (numpy bools too), got an int"),
    (NoSeed(), "reset() must take a seed keyword argument"),
    (Valid(dtype=np.float64, space_dtype=np.uint8), "has dtype float64, but the observation space "
                                                     "Box(0, 1, (4,), uint8) is uint8: its values would be cut"),
])
def test_each_rule_is_one_line_naming_the_env_and_the_rule(env, rule):
    message = contract_error(env)
    assert message.startswith("env 'Broken-v0' broke the gymnasium API: ")
    assert rule in message


def test_a_reset_returning_a_two_element_observation_no_longer_passes_as_obs_and_info():
    env = ResetObsOnly(size=2)
    obs, info = env.reset(seed=0)  # what used to happen: it unpacks, and training went on with garbage
    assert contract_error(env) == ("env 'Broken-v0' broke the gymnasium API: reset() must return (obs, info), "
                                   "got a numpy.ndarray of shape (2,)")


def test_dtypes_numpy_casts_safely_pass_and_lossy_ones_warn():
    assert check_env(Valid(dtype=np.float64), "Wide-v0", seed=0) == []  # float64 for float32: common, harmless
    assert check_env(Valid(dtype=np.int8), "Small-v0", seed=0) == []
    assert check_env(Valid(dtype=np.int64), "Ints-v0", seed=0) == [
        "env 'Ints-v0': observations of dtype int64 are cast to the observation space's float32"]


@pytest.mark.parametrize("reward", [1, 1.0, True, np.float32(1.0), np.int64(1), np.array(1.0), torch.tensor(1.0)])
def test_every_real_scalar_is_a_reward(reward):
    class Rewarding(Valid):
        def step(self, action):
            obs, _, *rest = super().step(action)
            return (obs, reward, *rest)

    assert check_env(Rewarding(), "Rewarding-v0", seed=0) == []


def test_spaces_must_be_gymnasium_spaces_of_supported_kinds():
    env = Valid()
    env.observation_space = None
    assert "observation_space must be a gymnasium.spaces.Space, got None" in contract_error(env)
    env = Valid()
    env.action_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(2)))
    assert contract_error(env).startswith("env 'Broken-v0' broke sf_core's env contract: unsupported action space")


def test_a_broken_env_under_gymnasium_wrappers_is_named_by_what_it_returned():
    gym.register("FourTupleWrapped-v0", entry_point=FourTuple, max_episode_steps=10)
    env = gym.make("FourTupleWrapped-v0")  # TimeLimit raises on the 4-tuple before the check sees it
    with pytest.warns(DeprecationWarning):  # gymnasium's own passive checker notices the old API too
        message = contract_error(env, "FourTupleWrapped-v0")
    assert "got a tuple of 4" in message and "seen under its wrappers, which raised ValueError" in message


def test_an_env_raising_while_checked_keeps_its_error_as_the_cause():
    class Raising(Valid):
        def reset(self, *, seed=None, options=None):
            raise RuntimeError("no simulator here")

    with pytest.raises(EnvCheckError, match="env 'Raising-v0' raised in reset.. when the runner checked it") as caught:
        check_env(Raising(), "Raising-v0", seed=0)
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.parametrize("make, agents", [
    (lambda: gym.make("CartPole-v1"), None),
    (lambda: MinimapDictEnv(seed=0), None),  # a Dict observation: uint8 image and float vector
    (RelayGame, 2),  # multi-agent: per-agent lists
    (Nim, 2),
])
def test_valid_envs_pass(make, agents):
    env = make()
    assert check_env(env, "Valid-v0", seed=3, agents=agents, supported=supported_spaces) == []


def test_the_check_leaves_the_env_action_space_generator_alone():
    env = Valid()
    env.action_space.seed(7)
    before = env.action_space.np_random.bit_generator.state
    check_env(env, "Valid-v0", seed=0)
    assert env.action_space.np_random.bit_generator.state == before


def test_multi_agent_envs_are_held_to_their_own_contract():
    class OneRewardForTwo(RelayGame):
        def step(self, actions):
            obs, rewards, terminated, truncated, infos = super().step(actions)
            return obs, rewards[:1], terminated, truncated, infos

    class ArrayRewardOfAgent1(RelayGame):
        def step(self, actions):
            obs, rewards, terminated, truncated, infos = super().step(actions)
            return obs, [rewards[0], np.array([1.0, 2.0])], terminated, truncated, infos

    prefix = "env 'Broken-v0' broke the multi-agent env contract (envs/multi_agent.py): "
    assert contract_error(OneRewardForTwo(), agents=2) == (
        prefix + "step() must return rewards with one entry per agent (2), got a list of 1")
    assert contract_error(ArrayRewardOfAgent1(), agents=2) == (
        prefix + "step() must return a reward of agent 1 that is a real scalar (a python number or a numpy "
                 "scalar), got a numpy.ndarray of shape (2,)")


# ------------------------------------------------------------------------------------------ in a worker
class LateShape(Valid):
    """Keeps the contract for 50 steps, then returns a 7-float observation."""

    def step(self, action):
        obs, *rest = super().step(action)
        self.steps = getattr(self, "steps", 0) + 1
        return (np.zeros(7, np.float32) if self.steps > 50 else obs, *rest)


def split_runner(kind, factory, rollout: int = 64):
    cfg, _ = parse_args(["--env=Late-v0", f"--batched_sampling={kind is VectorEnvRunner}", "--num_workers=1",
                         "--num_envs_per_worker=2", "--worker_num_splits=1", f"--rollout={rollout}",
                         f"--batch_size={2 * rollout}"])
    layout = BufferLayout.from_config(cfg)
    probe = factory("Late-v0", cfg, EnvContext(-1, -1, 0))
    buffers = TrajectoryBuffers(layout, SampleSpaces(probe.observation_space, probe.action_space))
    runner = kind(cfg, 0, 0, EnvRegistry({"Late-v0": factory}), buffers, layout, seed=0)
    runner.reset(runner.take_free_slot())
    return runner


@pytest.mark.parametrize("kind", [VectorEnvRunner, NonBatchedEnvRunner])
def test_a_worker_env_that_breaks_the_contract_later_is_named_not_a_broadcasting_error(kind):
    runner = split_runner(kind, lambda name, cfg, ctx: LateShape())
    with pytest.raises(EnvContractError) as caught:
        for _ in range(60):  # one trajectory of 64 steps holds them all
            runner.step()
    assert str(caught.value) == (
        "env 'Late-v0' (worker 0, split 0, env 0) broke the gymnasium API: step() returned an observation that "
        "has shape (7,), but the observation space Box(0.0, 1.0, (4,), float32) has shape (4,)")
    assert runner.t == 50  # 50 steps stored; the 51st was refused


def test_the_single_agent_adapter_names_a_broken_return():
    env = SingleAgentAdapter(FourTuple())
    env.reset(seed=0)
    with pytest.raises(EnvContractError, match="got a tuple of 4"):
        env.step([0])
    with pytest.raises(EnvContractError, match=r"reset\(\) must return \(obs, info\)"):
        SingleAgentAdapter(ResetObsOnly()).reset(seed=0)


# ------------------------------------------------------------------------------------------ end to end
BROKEN_ENVS = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np

    from sf_core import register_env


    class Env(gym.Env):
        def __init__(self, size=4, reset_returns_obs_only=False, late_shape=False):
            self.observation_space = gym.spaces.Box(0, 1, (size,), np.float32)
            self.action_space = gym.spaces.Discrete(2)
            self.size, self.obs_only, self.late_shape = size, reset_returns_obs_only, late_shape
            self.steps = self.t = 0

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            obs = np.zeros(self.size, np.float32)
            return obs if self.obs_only else (obs, {})

        def step(self, action):
            self.steps, self.t = self.steps + 1, self.t + 1
            obs = np.zeros(7 if self.late_shape and self.steps > 50 else self.size, np.float32)
            return obs, 1.0, False, self.t >= 20, {}


    register_env("ObsOnlyReset-v0", lambda name, cfg, ctx: Env(size=2, reset_returns_obs_only=True))
    register_env("LateShape-v0", lambda name, cfg, ctx: Env(late_shape=True))
''')


def run_broken(tmp_path, env: str, *args: str):
    (tmp_path / "broken_envs.py").write_text(BROKEN_ENVS)
    train_dir = tmp_path / "train"
    result = launch.run([f"--env={env}", "--env_module=broken_envs", f"--train_dir={train_dir}", "--num_workers=2",
                         "--num_envs_per_worker=2", "--train_for_seconds=60", *args], timeout=80, cwd=str(tmp_path))
    return result, train_dir


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_train_refuses_a_broken_env_before_anything_starts_and_check_env_false_skips_the_check(tmp_path):
    result, train_dir = run_broken(tmp_path, "ObsOnlyReset-v0")
    rule = "reset() must return (obs, info), got a numpy.ndarray of shape (2,)"
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines()[-1] == (f"sf_core.train: error: env 'ObsOnlyReset-v0' broke the gymnasium "
                                              f"API: {rule}")
    assert len((result.stdout + result.stderr).splitlines()) <= 3
    assert not train_dir.exists()  # no experiment folder: the runner probes before it writes anything
    # without the check the run starts; the workers' reset names the same rule, not a silent unpack
    result, train_dir = run_broken(tmp_path, "ObsOnlyReset-v0", "--check_env=False")
    assert result.returncode == 1, result.stdout + result.stderr
    assert train_dir.exists()
    assert result.stdout.splitlines()[-1].endswith(f"broke the gymnasium API: {rule}")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_env_that_goes_bad_in_a_worker_stops_the_run_with_the_same_one_line(tmp_path):
    started = time.time()
    result, train_dir = run_broken(tmp_path, "LateShape-v0")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    last = result.stdout.splitlines()[-1]  # the console log; stderr holds no traceback either
    assert "training stopped: rollout_worker_" in last
    assert ("env 'LateShape-v0' (worker " in last and "broke the gymnasium API: step() returned an observation "
            "that has shape (7,), but the observation space Box(0.0, 1.0, (4,), float32) has shape (4,)" in last)
    assert "Traceback" not in output and len(output.splitlines()) <= 10
    assert time.time() - started < 60
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(train_dir) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, f"processes outlived the trainer: {leftovers}"
