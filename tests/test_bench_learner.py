"""scripts/bench_learner.py, scripts/bench_sgd_step.py and scripts/bench_train_steps.py: they must keep running
against the current learner (its batch keys and node signatures), and what they report must be consistent."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from sf_core.cli.arguments import parse_args
from tests import launch

pytestmark = pytest.mark.slow  # every test here trains or runs a script


def run(script: str, args: list[str]) -> subprocess.CompletedProcess:
    proc = launch.run(args, timeout=120, script=f"scripts/{script}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("algo", ["APPO", "PPO", "REINFORCE"])
def test_bench_learner_runs_the_graph_and_the_hand_path(tmp_path, algo):
    out = tmp_path / "learner.json"
    run("bench_learner.py", [f"--algo={algo}", "--iterations=2", "--hidden", "32", f"--output={out}"])
    result = json.loads(out.read_text())
    assert result["algo"] == algo and result["samples_per_iteration"] == 32 * 64
    assert all(seconds > 0 for seconds in result["median_seconds"].values())
    # the same nodes on the same data: the executor is not an order of magnitude off the hand path
    assert 0.2 < result["graph_over_by_hand"] < 5


@pytest.mark.parametrize("flags", [[], ["--mixed_precision"]])
def test_bench_sgd_step_times_the_presets_model(flags):
    proc = run("bench_sgd_step.py", ["--env=CartPole-v1", "--flags=--encoder_mlp_layers 32", *flags])
    # 4 -> 32 MLP, 2 logits and 1 value: 4*32 + 32 + 32*3 + 3 trainable parameters
    assert "minibatch 1024, 259 parameters" in proc.stdout
    assert ("bf16 autocast" in proc.stdout) == bool(flags)
    step_ms = float(re.search(r"SGD step: ([\d.]+) ms", proc.stdout).group(1))
    assert 0 < step_ms < 1000


def test_bench_sgd_step_times_a_whole_iteration_of_the_presets_graph():
    flags = "--encoder_mlp_layers 16 --split_actor_critic=True --recompute_values=True"
    proc = run("bench_sgd_step.py", ["--env=Pendulum-v1", f"--flags={flags}", "--iteration"])
    cfg, _ = parse_args(["--env=Pendulum-v1", *flags.split()])
    found = re.search(r"training iteration: ([\d.]+) ms per dataset of ([\d,]+) samples", proc.stdout)
    assert found, proc.stdout
    assert int(found.group(2).replace(",", "")) == cfg.batch_size * cfg.num_batches_per_epoch
    step_ms, iteration_ms = float(re.search(r"SGD step: ([\d.]+) ms", proc.stdout).group(1)), float(found.group(1))
    assert iteration_ms > step_ms * cfg.num_epochs  # every epoch's steps, of both models


def test_bench_train_steps_times_both_forms_and_they_end_identical(tmp_path):
    out = tmp_path / "train_steps.json"
    run("bench_train_steps.py", ["--iterations=1", "--hidden", "16", f"--output={out}"])
    result = json.loads(out.read_text())
    assert result["bit_identical"] is True and result["samples"] == 2048
    assert result["one_after_the_other_ms"] > 0 and result["at_once_ms"] > 0
