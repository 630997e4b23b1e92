"""What a run reports beyond returns: the env's episode metrics (`episode_extra_stats`, `is_success`) and the busy
shares' TensorBoard points. (Periodic evaluation and best.pt: tests/test_periodic_evaluation.py.)"""

from __future__ import annotations

import json
import logging
import os

import gymnasium as gym
import numpy as np
import pytest

from sf_core.contracts.signals import RolloutReport
from sf_core.envs.multi_agent import MultiAgentEnv
from sf_core.run import stats as stats_module
from sf_core.run.stats import TrainingStats
from sf_core.sampling.episode_metrics import episode_metrics
from tests.corridor import CORRIDOR, make_corridor, tb_scalars
from tests.helpers import Scalars, train


def rollout(metrics=(), skipped=None, episodes=(), seconds=0.0) -> RolloutReport:
    return RolloutReport(0, 100, list(episodes), seconds, 0, metrics=list(metrics), skipped_metrics=skipped or {})


# ------------------------------------------------------------------------------------------ the rule
def test_extra_stats_in_sample_factorys_spelling_and_the_success_flag_are_metrics():
    info = {"episode_extra_stats": {"distance": 3, "speed": np.float32(0.5), "hits": np.array(2),
                                    "flag": np.bool_(True)}, "is_success": False, "other": 7.0}
    assert episode_metrics(info) == [("distance", 3.0), ("speed", 0.5), ("hits", 2.0), ("flag", 1.0),
                                     ("success_rate", 0.0)]
    assert episode_metrics({"lives": 3}) == []  # nothing else in the info is a metric


def test_values_that_are_not_finite_real_scalars_are_skipped_with_a_reason():
    found = dict(episode_metrics({"episode_extra_stats": {"map": np.zeros(3), "name": "a", "nan": float("nan"),
                                                          "return": 1.0, "ok": 1.5}, "is_success": None}))
    assert found["ok"] == 1.5
    assert "ndarray of shape (3,)" in found["map"] and "str" in found["name"] and "not finite" in found["nan"]
    assert "built-in" in found["return"] and "NoneType" in found["success_rate"]
    assert "not a dict" in dict(episode_metrics({"episode_extra_stats": [1.0]}))["episode_extra_stats"]


class TwoRunners(MultiAgentEnv):
    """Two agents walk for 1 and 2 steps; each reports its own metrics in its own info at its episode's end.
    On the third step agent 0 loses a life: a step the env does not count as an episode (Atari's convention)."""

    num_agents = 2
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t = 0
        return [np.zeros(1, np.float32)] * 2, [{}, {}]

    def step(self, actions):
        self.t += 1
        done = [self.t in (1, 3), self.t == 2]
        infos = [{}, {}]
        if self.t == 1:
            infos[0] = {"episode_extra_stats": {"score": 10.0, "bad": np.ones(2)}, "is_success": True}
        if self.t == 2:
            infos[1] = {"episode_extra_stats": {"score": 20.0, "bad": np.ones(2)}, "is_success": False}
        if self.t == 3:
            infos[0] = {"episode_return": None, "episode_length": None, "episode_extra_stats": {"score": 99.0}}
        return [np.zeros(1, np.float32)] * 2, [1.0, 1.0], done, [False, False], infos


def test_each_agent_records_its_own_metrics_at_the_end_of_its_episode():
    from sf_core.config import Config
    from sf_core.contracts.buffers import BufferLayout, TrajectoryBuffers
    from sf_core.contracts.sample import SampleSpaces
    from sf_core.envs.registry import EnvRegistry
    from sf_core.sampling.nonbatched_env_runner import NonBatchedEnvRunner

    cfg = Config(env="Two-v0", batched_sampling=False, num_workers=1, num_envs_per_worker=1, worker_num_splits=1,
                 rollout=4, batch_size=8)
    layout = BufferLayout.from_config(cfg, agents_per_env=2)
    buffers = TrajectoryBuffers(layout, SampleSpaces(TwoRunners.observation_space, TwoRunners.action_space))
    runner = NonBatchedEnvRunner(cfg, 0, 0, EnvRegistry({"Two-v0": lambda name, cfg, ctx: TwoRunners()}), buffers,
                                 layout, seed=0)
    runner.reset(runner.take_free_slot())
    for _ in range(3):
        runner.step()
    assert runner.finished_metrics == [(0, "score", 10.0), (0, "success_rate", 1.0),
                                       (0, "score", 20.0), (0, "success_rate", 0.0)]
    assert list(runner.skipped_metrics) == ["bad"]
    assert [e[2] for e in runner.finished_episodes] == [0, 1]  # the lost life is no episode, and has no metrics


# ------------------------------------------------------------------------------------------ the run's windows
def test_metrics_are_averaged_per_key_and_per_policy_over_the_window_and_written_everywhere(caplog):
    writer = Scalars()
    stats = TrainingStats(window=3, writer=writer, num_policies=2)
    episodes = [(1.0, 5, 0, 0), (2.0, 5, 0, 1)]
    with caplog.at_level(logging.WARNING, logger="sf_core"):
        stats.add(rollout([(0, "score", 1.0), (1, "score", 3.0), (0, "success_rate", 1.0)], {"bad": "not a dict"},
                          episodes))
        stats.add(rollout([(0, "score", 5.0), (0, "score", 7.0), (1, "success_rate", 0.0)], {"bad": "again"}))
    assert [r.getMessage() for r in caplog.records if "bad" in r.getMessage()] == [
        "episode metric 'bad' from the env's info is skipped: not a dict (logged once per key)"]
    # the window keeps the last 3 values of each key: scores 3, 5, 7
    assert stats.metrics.means() == {"score": 5.0, "success_rate": 0.5}
    assert stats.metrics.means(0) == {"score": pytest.approx(13 / 3), "success_rate": 1.0}
    assert stats.metrics.means(1) == {"score": 3.0, "success_rate": 0.0}
    stats.write_summaries()
    assert writer.scalars["episode/score"] == [(200, 5.0)] and writer.scalars["episode/success_rate"] == [(200, 0.5)]
    assert writer.scalars["policy_1/episode/score"] == [(200, 3.0)]
    summary = stats.summary(0, None)
    assert summary["episode_metrics"] == {"score": 5.0, "success_rate": 0.5}
    assert summary["policies"][0]["episode_metrics"]["success_rate"] == 1.0
    assert "| success 50% |" in stats.console_line()
    # PBT may rank policies by one of them (Sample Factory keeps its objectives in episode_extra_stats)
    assert stats.objective(1, "score") == 3.0 and stats.objective(1, "unknown") is None


def test_metric_windows_survive_a_resume_and_old_checkpoints_restore_without_them():
    stats = TrainingStats(window=5, num_policies=2)
    stats.add(rollout([(0, "score", 1.0), (1, "score", 2.0)]))
    saved = [stats.checkpoint_state(0.0, p) for p in range(2)]
    resumed = TrainingStats(window=5, num_policies=2)
    resumed.restore(saved[0])
    for p in range(2):
        resumed.restore_policy(p, saved[p])
    assert resumed.metrics.means() == {"score": 1.5} and resumed.metrics.means(1) == {"score": 2.0}
    old = {k: v for k, v in saved[0].items() if k != "recent_metrics"}  # a checkpoint of an earlier version
    old["policy_stats"] = {k: v for k, v in old["policy_stats"].items() if k != "recent_metrics"}
    fresh = TrainingStats(window=5)
    fresh.restore(old)
    fresh.restore_policy(0, old)
    assert fresh.metrics.means() == {}


# ------------------------------------------------------------------------------------------ busy shares
def test_busy_shares_are_written_only_over_a_window_that_means_something_and_never_above_one(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(stats_module.time, "time", lambda: now[0])
    writer = Scalars()
    stats = TrainingStats(window=10, writer=writer, started=now[0],
                          component_counts={"env_step": 2, "inference": 1, "learner": 1})
    now[0] += 2.0
    stats.seconds.update(env_step=1.0, inference=3.5, learner=0.5)  # a report also counted work from before
    stats.write_summaries()
    assert {tag: v for tag, v in writer.scalars.items() if tag.endswith("_busy")} == {
        "perf/env_step_busy": [(0, 0.25)], "perf/inference_busy": [(0, 1.0)], "perf/learner_busy": [(0, 0.25)]}
    now[0] += 0.05  # the closing summary, right after the last one, after one more learner report: no point
    stats.seconds["learner"] += 0.2
    stats.write_summaries()
    assert len(writer.scalars["perf/learner_busy"]) == 1
    now[0] += 3.0  # the window carried on: 0.2 s of SGD over 3.05 s
    stats.write_summaries()
    assert writer.scalars["perf/learner_busy"][-1] == (0, pytest.approx(0.2 / 3.05))
    assert writer.scalars["perf/env_step_busy"][-1] == (0, 0.0)
    now[0] += 3.0  # a window in which no component reported: no point either
    stats.write_summaries()
    assert len(writer.scalars["perf/learner_busy"]) == 2


# ------------------------------------------------------------------------------------------ a run
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_run_logs_the_envs_extra_stats_and_success_rate(tmp_path):
    from sf_core import register_env

    register_env("Corridor-v0", make_corridor)
    code, summary = train(tmp_path, *CORRIDOR, "--num_workers=2", "--train_for_env_steps=24000")
    assert code == 0, summary.get("error")
    metrics = summary["episode_metrics"]
    assert sorted(metrics) == ["distance", "steps", "success_rate"]
    assert 0 < metrics["success_rate"] <= 1 and 1 <= metrics["steps"] <= 50
    scalars = tb_scalars(tmp_path / "exp")
    for key in metrics:
        assert scalars[f"episode/{key}"], key
    assert scalars["episode/success_rate"][-1][1] == pytest.approx(metrics["success_rate"], abs=1e-6)
    # the busy shares' points are shares, the last one included
    assert all(0.0 <= v <= 1.0 for tag in scalars if tag.endswith("_busy") for _, v in scalars[tag])
    with open(tmp_path / "exp" / "config.json") as f:
        assert json.load(f)["eval_every_env_steps"] == 0  # evaluation stays off unless asked for
    assert not os.path.exists(tmp_path / "exp" / "checkpoint" / "evaluation.json")
