"""Periodic deterministic evaluation (--eval_every_env_steps) and the best.pt it chooses: the schedule, the held
checkpoints, the evaluator's episodes, the records that survive a resume, and a run with it on."""

from __future__ import annotations

import json
import logging
import os
import re

import gymnasium as gym
import pytest
import torch

from sf_core.config import Config
from sf_core.contracts.signals import EvalReport
from sf_core.records import checkpoint
from sf_core.run.evaluations import Evaluations
from sf_core.run.stats import TrainingStats
from tests.corridor import CORRIDOR, make_corridor, tb_scalars
from tests.helpers import Scalars, train

CFG = Config(env="CartPole-v1", eval_every_env_steps=1000, eval_episodes=2, keep_checkpoints=1, seed=5,
             encoder_mlp_layers=[16])


def save(directory: str, version: int, frames: int) -> str:
    """A checkpoint as the learner writes it (the newest --keep_checkpoints=1 kept)."""
    state = {"version": version, "runner": {"frames": frames}, "model": {"w": torch.full((1,), float(version))}}
    return checkpoint.save(directory, state, keep=CFG.keep_checkpoints, is_best=False)


def best_version(directory: str) -> int:
    return int(checkpoint.load(os.path.join(directory, checkpoint.BEST))["version"])


def evaluate(evaluations: Evaluations, stats: TrainingStats, directory: str, version: int, frames: int,
             returns: list[float]) -> None:
    """An evaluation point passes, the learner saves, the evaluator plays the held checkpoint and reports."""
    assert evaluations.due(frames)
    sent: list[tuple[int, str]] = []
    evaluations.saved(save(directory, version, frames), lambda *request: sent.append(request))
    assert len(sent) == 1 and os.path.exists(sent[0][1])
    assert evaluations.take(EvalReport(0, sent[0][1], version, frames, returns, [5] * len(returns)), stats)


def test_best_pt_is_the_best_evaluation_held_through_rotation_and_remembered_across_a_resume(tmp_path, caplog):
    directory = checkpoint.checkpoint_dir(str(tmp_path))
    stats = TrainingStats(window=10, writer=Scalars())
    evaluations = Evaluations(CFG, [directory])
    evaluations.start(stats)
    assert not evaluations.due(999) and evaluations.due(1000) and not evaluations.due(1999)
    sent: list[tuple[int, str]] = []
    first = save(directory, 1, 1000)
    evaluations.saved(first, lambda *request: sent.append(request))
    evaluations.saved(save(directory, 2, 1200), lambda *request: sent.append(request))  # not asked for
    assert not os.path.exists(first) and len(sent) == 1  # rotated away: the held name keeps it for its evaluation
    assert not evaluations.due(2000)  # its evaluation still runs: this point is skipped
    with caplog.at_level(logging.INFO, logger="sf_core"):
        evaluations.take(EvalReport(0, sent[0][1], 1, 1000, [10.0, 20.0], [5, 7], {"success_rate": 0.5}), stats)
    assert "eval at 1,000 frames: mean return 15.0 ± 5.0 over 2 episodes, success 50% (best so far)" in caplog.text
    assert best_version(directory) == 1
    assert stats.writer.scalars["eval/mean_return"] == [(1000, 15.0)]
    assert stats.writer.scalars["eval/std_return"] == [(1000, 5.0)]
    assert stats.writer.scalars["eval/success_rate"] == [(1000, 0.5)]
    evaluate(evaluations, stats, directory, 3, 3000, [1.0, 1.0])  # worse: best.pt stays
    assert best_version(directory) == 1 and stats.evaluation["last"]["policy_version"] == 3
    assert stats.summary(0, None)["evaluation"]["best"] == {
        "frames": 1000, "policy_version": 1, "mean_return": 15.0, "std_return": 5.0, "episodes": 2,
        "mean_length": 6.0, "seconds": 0.0, "episode_metrics": {"success_rate": 0.5}}

    resumed_stats = TrainingStats(window=10, writer=Scalars())
    resumed_stats.frames = 3000
    resumed = Evaluations(CFG, [directory])
    resumed.start(resumed_stats)
    assert resumed_stats.evaluation["best"]["policy_version"] == 1  # from evaluation.json
    assert not resumed.due(3999)
    evaluate(resumed, resumed_stats, directory, 4, 4000, [12.0, 12.0])  # better than the last, not the best
    assert best_version(directory) == 1
    evaluate(resumed, resumed_stats, directory, 5, 5000, [16.0, 16.0])
    assert best_version(directory) == 5
    assert checkpoint.load_evaluations(directory)["best"]["frames"] == 5000
    assert not [f for f in os.listdir(directory) if f.startswith(checkpoint.HELD)]


def test_the_evaluator_plays_the_same_deterministic_episodes_on_an_evaluation_env(tmp_path):
    from signal_slot.signal_slot import EventLoop

    from sf_core.algo.model import ActorCritic, ModelSpec
    from sf_core.envs.registry import EnvRegistry
    from sf_core.sampling.periodic_evaluator import EVAL_SEED_OFFSET, Evaluator

    contexts = []

    def make(name, cfg, ctx):
        contexts.append(ctx)
        return gym.make("CartPole-v1")

    env = gym.make("CartPole-v1")
    spec = ModelSpec.from_config(CFG)
    model = ActorCritic(env.observation_space, env.action_space, spec)
    path = checkpoint.save(str(tmp_path), {"version": 3, "runner": {"frames": 500}, "model": model.state_dict()},
                           keep=2, is_best=False)
    evaluator = Evaluator(EventLoop("evaluation_test_loop", serial_mode=True), CFG, EnvRegistry({"CartPole-v1": make}),
                          env.observation_space, env.action_space, spec)
    try:
        first, second = evaluator.evaluate_now(0, path), evaluator.evaluate_now(0, path)
        assert first is not None and second is not None
        assert len(first.returns) == CFG.eval_episodes and first.returns == second.returns  # same seed, same acts
        assert first.lengths == [int(r) for r in first.returns]  # CartPole pays 1 a step
        assert (first.version, first.frames, first.policy) == (3, 500, 0)
        assert len(contexts) == 1 and contexts[0].evaluation and contexts[0].seed == CFG.seed + EVAL_SEED_OFFSET
        assert evaluator.evaluate_now(0, path, stopping=lambda: True) is None  # the run stops: no result
        # the end of a run: its final weights are evaluated once, unless it stopped on an error or a signal
        stats = TrainingStats(window=10, writer=Scalars())
        evaluations = Evaluations(CFG, [str(tmp_path)])
        evaluations.start(stats)
        evaluations.finish(evaluator, stats, ended_well=False)
        assert "last" not in stats.evaluation and not os.path.exists(tmp_path / checkpoint.BEST)
        evaluations.finish(evaluator, stats, ended_well=True)
        assert stats.evaluation["last"]["policy_version"] == 3 and best_version(str(tmp_path)) == 3
        assert stats.writer.scalars["eval/mean_return"] == [(500, pytest.approx(sum(first.returns) / 2))]
        evaluations.finish(evaluator, stats, ended_well=True)  # those weights were evaluated already
        assert len(stats.writer.scalars["eval/mean_return"]) == 1
        assert not [f for f in os.listdir(tmp_path) if f.startswith(checkpoint.HELD)]
    finally:
        evaluator.close()


@pytest.mark.parametrize("argv, message", [
    (["--eval_every_env_steps=-5"], "--eval_every_env_steps must be at least 0 (0: no evaluation), got -5"),
    (["--eval_every_env_steps=1000", "--eval_episodes=0"], "--eval_episodes must be at least 1, got 0"),
    (["--eval_every_env_steps=1000", "--env_service=skip:CartPole-v1"],
     "--eval_every_env_steps does not work with --env_service"),
])
def test_bad_evaluation_flags_are_one_message(argv, message):
    from sf_core.cli.arguments import parse_args
    from sf_core.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_args(["--env=CartPole-v1", *argv])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_run_evaluates_periodically_keeps_the_best_evaluated_weights_and_resumes_with_them(tmp_path):
    """The corridor's deterministic policy walks into the wall for the first ~30k frames (return -5), then straight
    to the goal (1.7): the evaluations differ, and best.pt must be the best of them."""
    from sf_core import register_env

    register_env("Corridor-v0", make_corridor)
    flags = [*CORRIDOR, "--eval_every_env_steps=10000", "--eval_episodes=3", "--keep_checkpoints=1"]
    code, summary = train(tmp_path, *flags, "--num_workers=1", "--train_for_env_steps=40000")
    assert code == 0, summary.get("error")
    evaluation = summary["evaluation"]
    assert evaluation["every_env_steps"] == 10000 and evaluation["last"]["episodes"] >= 3
    # the final weights were evaluated
    assert evaluation["last"]["policy_version"] == checkpoint.version_of(summary["last_checkpoint"])
    assert evaluation["last"]["episode_metrics"]["success_rate"] in (0.0, 1.0)  # deterministic: all or none
    path = tmp_path / "exp"
    scalars = tb_scalars(path)
    means = dict(scalars["eval/mean_return"])
    assert len(means) >= 2 and len(scalars["eval/std_return"]) == len(means)  # at least one point, and the end
    best = evaluation["best"]
    assert means[best["frames"]] == pytest.approx(best["mean_return"]) == pytest.approx(max(means.values()))
    directory = checkpoint.checkpoint_dir(str(path))
    assert best_version(directory) == best["policy_version"]
    assert not [f for f in os.listdir(directory) if f.startswith(checkpoint.HELD)]

    # resumed (serially: the evaluator runs on the runner's loop) with the best remembered
    code, resumed = train(tmp_path, *flags, "--serial_mode=True", "--train_for_env_steps=50000")
    assert code == 0, resumed.get("error")
    assert resumed["evaluation"]["best"]["mean_return"] >= best["mean_return"]
    assert resumed["evaluation"]["last"]["frames"] > evaluation["last"]["frames"]
    assert best_version(directory) == resumed["evaluation"]["best"]["policy_version"]
    with open(os.path.join(directory, checkpoint.EVALUATIONS)) as f:
        assert json.load(f)["best"] == resumed["evaluation"]["best"]
