"""Export and Hub staging of a run of several policies: one policy goes, the best by default or the one
--policy_index names; what is written says which, and a staged folder loads that policy again."""

from __future__ import annotations

import json
import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from sf_core.cli.push_to_hub import stage
from sf_core.config import ConfigError
from sf_core.evaluation.policy import load_checkpoint
from sf_core.records import checkpoint
from sf_core.sharing.exported_policy import export
from tests.policies import multi_policy_experiment, packed
from tests.test_policy_choice import assert_same_weights


def test_export_writes_the_chosen_policy(tmp_path):
    path, models = multi_policy_experiment(tmp_path, "pop", [10.0, 50.0, 20.0], best_policy=1)
    observations = [np.array([0.1, -0.2, 0.03, 0.4], np.float32), np.array([-1.0, 0.5, -0.1, -0.3], np.float32)]
    rows = packed(gym.make("CartPole-v1").observation_space, observations)  # the model's input
    for flags, expected in (({}, 1), ({"policy_index": 2}, 2)):
        out = export(path, "torchscript", output=str(tmp_path / f"out{expected}" / "policy.pt"), **flags)
        with open(os.path.join(os.path.dirname(out), "policy.json")) as f:
            assert json.load(f)["policy_index"] == expected
        traced = torch.jit.load(out)
        with torch.no_grad():
            params = traced(torch.from_numpy(np.stack(observations)))[1]
            reference = models[expected].step(rows, models[expected].initial_state(len(rows)))[0]
            other = models[3 - expected].step(rows, models[3 - expected].initial_state(len(rows)))[0]
        torch.testing.assert_close(params, reference)
        assert not torch.allclose(params, other)  # the policies act differently: the check can fail


def write_eval_results(path: str, policy_index: int) -> None:
    results = {"episodes": 2, "mean_return": 12.0, "std_return": 1.0, "mean_length": 12.0, "returns": [11.0, 13.0],
               "lengths": [11, 13], "policy_version": 10 + policy_index, "policy_index": policy_index,
               "deterministic": True, "env": "CartPole-v1"}
    with open(os.path.join(path, "eval_results.json"), "w") as f:
        json.dump(results, f)


def test_staging_uploads_the_evaluated_policy_which_loads_again(tmp_path):
    path, models = multi_policy_experiment(tmp_path / "runs", "pop", [10.0, 50.0, 20.0], best_policy=1)
    write_eval_results(path, 1)
    export(path, "torchscript", policy_index=0)  # another policy's export: not the uploaded agent's
    staged = str(tmp_path / "staged")
    files = stage(path, "someone/pop", staged)
    name = os.path.basename(checkpoint.latest_checkpoint(checkpoint.checkpoint_dir(path, 1, 3)))
    assert sorted(files) == sorted(["README.md", f"checkpoint_p1/{name}", "config.json", "eval_results.json"])
    with open(os.path.join(staged, "README.md")) as f:
        assert "policy 1 of the 3 trained together" in f.read()
    # what load_from_hub copies back: config.json still says 3 policies, only policy 1 has checkpoints
    loaded = load_checkpoint(staged)
    assert loaded.policy_index == 1
    assert_same_weights(loaded.weights, models[1])

    with pytest.raises(ConfigError, match=r"policy 1's evaluation, but policy 2 would be uploaded.*"
                                          r"sf_core.enjoy --policy_index=2"):
        stage(path, "someone/pop", str(tmp_path / "other"), policy_index=2)
