"""Non-batched sampling and multi-agent envs: the contract, the PettingZoo adapter, the runner's rows,
and self-play learning with one shared policy."""

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch

from sf_core.algo import nodes
from sf_core.algo.graph import Context
from sf_core.envs.multi_agent import SingleAgentAdapter, is_multi_agent, num_agents
from sf_core.envs.pettingzoo import PettingZooParallelEnv
from sf_core.envs.registry import EnvContext, EnvRegistry
from sf_core.envs.relay_game import RelayGame, make_relay_game
from sf_core import register_env
from sf_core.cli.arguments import parse_args
from sf_core.contracts.buffers import BufferLayout, TrajectoryBuffers
from sf_core.contracts.sample import SampleSpaces
from sf_core.sampling.nonbatched_env_runner import NonBatchedEnvRunner
from sf_core.sampling.split_runner import EnvStepError
from tests.helpers import train

pettingzoo = pytest.importorskip("pettingzoo")


class Race(pettingzoo.ParallelEnv):
    """A PettingZoo parallel env whose agents finish at different times: each walks right along a
    corridor; reaching the end pays 1 and removes the agent, every step costs 0.05, and agents still
    walking after `max_cycles` steps are truncated. All start at 0, or runner i at i when `staggered`: then
    even agents that always walk right finish at different steps. From 0 the best return is 1 - 0.05 × (length - 2)."""

    metadata = {"name": "race_v0", "render_modes": ["rgb_array"]}

    def __init__(self, num_agents: int = 3, length: int = 6, max_cycles: int = 20, render_mode=None,
                 staggered: bool = False):
        self.possible_agents = [f"runner_{i}" for i in range(num_agents)]
        self.starts = {a: (i % (length - 1) if staggered else 0) for i, a in enumerate(self.possible_agents)}
        self.length, self.max_cycles, self.render_mode = length, max_cycles, render_mode
        self._obs_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self._act_space = gym.spaces.Discrete(2)  # 0: left, 1: right

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _obs(self, agent):
        obs = np.zeros(self.length, np.float32)
        obs[self.pos[agent]] = 1.0
        return obs

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.pos = dict(self.starts)
        self.steps = 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.steps += 1
        rewards, terms, truncs = {}, {}, {}
        for agent, action in actions.items():
            self.pos[agent] = min(self.length - 1, max(0, self.pos[agent] + (1 if action == 1 else -1)))
            terms[agent] = self.pos[agent] == self.length - 1
            truncs[agent] = self.steps >= self.max_cycles and not terms[agent]
            rewards[agent] = 1.0 if terms[agent] else -0.05
        obs = {a: self._obs(a) for a in actions}
        infos = {a: {} for a in actions}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def render(self):
        frame = np.zeros((8 * len(self.possible_agents), 8 * self.length, 3), np.uint8)
        for i, agent in enumerate(self.possible_agents):
            x = self.pos.get(agent, 0)
            frame[8 * i:8 * i + 8, 8 * x:8 * x + 8] = 255
        return frame


def make_race(name, cfg, ctx):  # module level: worker processes import it by name
    return PettingZooParallelEnv(Race(render_mode=ctx.render_mode, staggered=True))


# ------------------------------------------------------------------------------------------ contract
def test_race_is_a_valid_pettingzoo_parallel_env():
    from pettingzoo.test import parallel_api_test

    parallel_api_test(Race(), num_cycles=50)


def test_pettingzoo_adapter_dead_agents_truncation_and_auto_reset():
    env = PettingZooParallelEnv(Race(num_agents=2, length=3, max_cycles=4, render_mode="rgb_array"))
    assert is_multi_agent(env) and num_agents(env) == 2
    assert env.observation_space.shape == (3,) and env.action_space == gym.spaces.Discrete(2)
    obs, infos = env.reset(seed=0)
    assert [info["is_active"] for info in infos] == [True, True]

    # agent 0 runs to the end in 2 steps; agent 1 dawdles
    env.step([1, 0])
    obs, rewards, term, trunc, infos = env.step([1, 0])
    assert term == [True, False] and rewards == [1.0, -0.05]
    assert [info["is_active"] for info in infos] == [False, True]
    assert not obs[0].any(), "a finished agent's observation is zeros"

    obs, rewards, term, trunc, infos = env.step([1, 0])  # agent 0's action is not passed on
    assert rewards == [0.0, -0.05] and term == [False, False]
    # step 4: the time limit cuts agent 1, the env is empty and resets itself
    obs, rewards, term, trunc, infos = env.step([0, 1])
    assert trunc == [False, True] and term == [False, False]
    np.testing.assert_array_equal(infos[1]["final_obs"], [0, 1, 0])
    assert [info["is_active"] for info in infos] == [True, True]
    np.testing.assert_array_equal(obs[0], [1, 0, 0])  # the first observation of the next episode
    frame = env.render()
    assert frame.shape == (16, 24, 3) and frame.dtype == np.uint8


def test_pettingzoo_adapter_one_hot_observations_and_spaces():
    from pettingzoo.classic import rps_v2

    env = PettingZooParallelEnv(rps_v2.parallel_env())
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    obs, _ = env.reset(seed=1)
    assert [o.tolist() for o in obs] == [[0, 0, 0, 1]] * 2  # rps starts with "no move" (3)
    env.close()


def test_unwrapped_pettingzoo_env_from_a_factory_gets_a_hint():
    registry = EnvRegistry({"Race-v0": lambda name, cfg, ctx: Race()})
    with pytest.raises(ValueError, match="wrap it in sf_core.envs.pettingzoo.PettingZooParallelEnv"):
        registry.make("Race-v0", None, EnvContext(0, 0, 0))


def test_single_agent_adapter_auto_resets_and_keeps_final_obs():
    env = SingleAgentAdapter(gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=3))
    obs, _ = env.reset(seed=0)
    for _ in range(2):
        env.step([0])
    obs, _, _, trunc, infos = env.step([0])
    assert trunc == [True] and "final_obs" in infos[0]
    assert not np.array_equal(obs[0], infos[0]["final_obs"])  # obs starts the next episode


# ------------------------------------------------------------------------------------------ runner rows
def make_runner(factory, agents: int, envs: int = 2, rollout: int = 8):
    cfg, _ = parse_args(["--env=Race-v0", "--batched_sampling=False", "--num_workers=1",
                         f"--num_envs_per_worker={envs}", "--worker_num_splits=1", f"--rollout={rollout}",
                         f"--batch_size={rollout * envs * agents}", "--reward_scale=2.0"])
    layout = BufferLayout.from_config(cfg, agents_per_env=agents)
    probe = factory("Race-v0", cfg, EnvContext(-1, -1, 0))
    buffers = TrajectoryBuffers(layout, SampleSpaces(probe.observation_space, probe.action_space))
    runner = NonBatchedEnvRunner(cfg, 0, 0, EnvRegistry({"Race-v0": factory}), buffers, layout, seed=0)
    runner.reset(runner.take_free_slot())
    return runner, buffers


def test_non_batched_runner_rows_per_agent_inactive_mask_and_truncation():
    factory = functools.partial(lambda agents, name, cfg, ctx: PettingZooParallelEnv(
        Race(num_agents=agents, length=3, max_cycles=4)), 2)
    runner, buffers = make_runner(factory, agents=2)
    assert buffers["obs"].shape[2] == 4  # 2 envs × 2 agents
    # rows: env 0 agents 0/1, env 1 agents 0/1. Env 0's agent 0 runs, everyone else waits.
    plan = [[1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]]
    for t, actions in enumerate(plan):
        buffers["actions"][runner.slot, t] = torch.tensor(actions)
        truncated_any = runner.step()
    slot = runner.slot
    assert runner.t == 4 and truncated_any
    torch.testing.assert_close(buffers["rewards"][slot, 1], torch.tensor([2.0, -0.1, -0.1, -0.1]))  # reward_scale 2
    assert buffers["dones"][slot, 1].tolist() == [True, False, False, False]
    # env 0's agent 0 finished at step 1: rows 2 and 3 of it are inactive (done, no reward)
    assert buffers["inactive"][slot, :5, 0].tolist() == [False, False, True, True, False]
    assert buffers["rewards"][slot, 2, 0] == 0 and buffers["dones"][slot, 2, 0]
    assert not buffers["obs"][slot, 2, 0].any()
    # step 3 cuts the other three agents by the time limit: final observations kept per row
    assert buffers["truncated"][slot, 3].tolist() == [False, True, True, True]
    torch.testing.assert_close(buffers.final_obs[0, 1], torch.tensor([0.0, 1.0, 0.0]))
    torch.testing.assert_close(buffers.final_obs[0, 2], torch.tensor([1.0, 0.0, 0.0]))
    # episode statistics per agent, with raw rewards
    episodes = sorted(runner.finished_episodes, key=lambda e: (e[1], e[2]))
    assert episodes[0] == (pytest.approx(0.95), 2, 0, 0)  # (return, length, agent, policy)
    assert sorted(e[2] for e in episodes) == [0, 0, 1, 1]
    assert buffers["inactive"][slot, 4].tolist() == [False] * 4  # everyone back after the auto-reset


def test_agent_going_inactive_mid_episode_is_refused():
    class Vanishing(RelayGame):
        def step(self, actions):
            obs, rewards, _, trunc, _ = super().step(actions)
            return obs, rewards, [False, False], trunc, [{"is_active": False}, {}]

    runner, _ = make_runner(lambda name, cfg, ctx: Vanishing(), agents=2)
    with pytest.raises(EnvStepError, match="inactive in the middle of its episode"):
        runner.step()


def test_lag_mask_leaves_inactive_rows_out():
    from sf_core.algo.params import LearningParams

    cfg, _ = parse_args(["--env=X", "--max_policy_lag=5"])
    ctx = Context({}, LearningParams.from_config(cfg))
    ctx.policy_version = 10
    out = nodes.lag_mask(ctx, {"policy_version": torch.tensor([[10, 10, 2]]),
                               "inactive": torch.tensor([[False, True, False]])})
    assert out["mask"].tolist() == [[1.0, 0.0, 0.0]]
    assert out["lag_stats"]["inactive_fraction"] == pytest.approx(1 / 3)
    assert out["lag_stats"]["dropped_for_lag_fraction"] == pytest.approx(0.5)


class FlakyRelay(RelayGame):
    """Raises on its 30th step (every new instance starts counting again)."""

    def step(self, actions):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 30:
            raise RuntimeError("the relay dropped the call")
        return super().step(actions)


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["stop", "restart"])
def test_multi_agent_env_faults_stop_or_restart_the_split(tmp_path, policy):
    register_env("FlakyRelay-v0", lambda name, cfg, ctx: FlakyRelay())
    code, summary = train(tmp_path, "--env=FlakyRelay-v0", "--batched_sampling=False", "--serial_mode=True",
                          "--num_workers=1", "--num_envs_per_worker=2", "--rollout=8", "--batch_size=64",
                          "--encoder_mlp_layers", "16", "--train_for_env_steps=2000", f"--env_fault_policy={policy}",
                          "--seed=5")
    if policy == "stop":
        assert code == 1 and "the relay dropped the call" in summary["error"]
        assert "FlakyRelay-v0" in summary["error"]
    else:
        assert code == 0, summary.get("error")
        assert summary["env_faults"] >= 2 and summary["frames"] >= 2000


# ------------------------------------------------------------------------------------------ flags
@pytest.mark.slow
def test_batched_sampling_false_is_accepted_and_multi_agent_needs_it(tmp_path, capsys):
    cfg, _ = parse_args(["--env=RelayGame-v0", "--batched_sampling=False"])
    assert cfg.batched_sampling is False
    register_env("RelayGame-v0", make_relay_game)
    code, _ = train(tmp_path, "--env=RelayGame-v0", "--serial_mode=True")
    assert code == 1
    assert "multi-agent env (2 agents): it needs --batched_sampling=False" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ learning
RELAY_FLAGS = ("--env=RelayGame-v0", "--batched_sampling=False", "--num_envs_per_worker=32",
               "--worker_num_splits=1", "--rollout=8", "--batch_size=512", "--num_epochs=4",
               "--encoder_mlp_layers", "64", "--learning_rate=0.003", "--target_mean_return=0.75",
               "--train_for_seconds=55")


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_two_agent_self_play_learns_non_batched_serial_then_enjoy(tmp_path):
    """Each agent's target is seen only by the other: random play scores 0.25 and no policy can beat
    0.25 without using the other agent's signal, so 0.75 means both rows learned to talk."""
    import json

    import sf_core.enjoy

    register_env("RelayGame-v0", make_relay_game)
    code, summary = train(tmp_path, *RELAY_FLAGS, "--serial_mode=True", "--num_workers=1", "--seed=1")
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, f"not learned: {summary}"
    assert set(summary["agent_mean_returns"]) == {"0", "1"}
    assert min(summary["agent_mean_returns"].values()) >= 0.6, summary["agent_mean_returns"]

    code = sf_core.enjoy.main([f"--train_dir={tmp_path}", "--experiment=exp", "--max_num_episodes=40",
                               "--save_video=True", "--video_frames=10"])
    assert code == 0
    with open(tmp_path / "exp" / "eval_results.json") as f:
        results = json.load(f)
    assert results["episodes"] >= 40 and sorted(set(results["agents"])) == [0, 1]
    assert results["mean_return"] >= 0.6, results
    assert (tmp_path / "exp" / "replay.mp4").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_agent_self_play_learns_async(tmp_path):
    register_env("RelayGame-v0", make_relay_game)
    code, summary = train(tmp_path, *RELAY_FLAGS, "--num_workers=2", "--seed=2")
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, f"not learned: {summary}"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_pettingzoo_env_with_early_finishers_learns(tmp_path):
    """Agents leave the race at different steps, even when all play their best: the inactive rows they leave
    must not spoil training. Random play averages about -0.21 (measured, 3000 episodes); the best is 0.85."""
    register_env("Race-v0", make_race)
    code, summary = train(tmp_path, "--env=Race-v0", "--batched_sampling=False", "--serial_mode=True",
                          "--num_workers=1", "--num_envs_per_worker=8", "--worker_num_splits=1", "--rollout=16",
                          "--batch_size=384", "--encoder_mlp_layers", "64", "--learning_rate=0.002",
                          "--target_mean_return=0.6", "--train_for_seconds=60", "--seed=3")
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, f"not learned: {summary}"
    assert summary["final_learner_stats"]["inactive_fraction"] > 0.0


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_real_pettingzoo_env_by_name_trains_and_records_video(tmp_path):
    """rock-paper-scissors from pettingzoo.classic, competitive self-play, by its module name only."""
    import imageio.v2 as imageio

    import sf_core.enjoy

    code, summary = train(tmp_path, "--env=pettingzoo:pettingzoo.classic.rps_v2", "--batched_sampling=False",
                          "--serial_mode=True", "--num_workers=1", "--num_envs_per_worker=4", "--rollout=16",
                          "--batch_size=256", "--encoder_mlp_layers", "32", "--train_for_env_steps=3000",
                          "--seed=4")
    assert code == 0, summary.get("error")
    assert summary["episodes"] > 0 and set(summary["agent_mean_returns"]) == {"0", "1"}
    assert sum(summary["agent_mean_returns"].values()) == pytest.approx(0.0, abs=1e-6)  # zero-sum
    code = sf_core.enjoy.main([f"--train_dir={tmp_path}", "--experiment=exp", "--max_num_episodes=2",
                               "--save_video=True", "--video_frames=5"])
    assert code == 0
    reader = imageio.get_reader(str(tmp_path / "exp" / "replay.mp4"))
    try:
        assert reader.count_frames() == 5
    finally:
        reader.close()


@pytest.mark.timeout(60)
def test_relay_game_renders_rgb_array():
    env = make_relay_game("RelayGame-v0", None, type("Ctx", (), {"render_mode": "rgb_array"})())
    env.reset(seed=0)
    env.step([0, 1])
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
