"""Loading one policy of a run of several (--num_policies): the best by default (training_summary.json's
choice, else the highest mean return a latest checkpoint recorded), or the one --policy_index names; the
folders of runs that do not have it refused by name; the commands that load a policy say which one."""

from __future__ import annotations

import json
import logging
import os
import shutil
from contextlib import contextmanager

import pytest
import torch

from sf_core.config import ConfigError
from sf_core.evaluation.policy import load_checkpoint
from sf_core.records import checkpoint
from tests.policies import multi_policy_experiment, random_policy_experiment


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def sf_core_log():
    """The sf_core logger's messages (an entry point run earlier may have stopped its propagation)."""
    logger, recorder = logging.getLogger("sf_core"), Recorder()
    level = logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.INFO)
    try:
        yield recorder.messages
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(level)


def assert_same_weights(weights: dict, model: torch.nn.Module) -> None:
    expected = model.state_dict()
    assert weights.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=0)


def test_by_default_the_policy_the_training_summary_names_is_loaded(tmp_path):
    # the checkpoints rank policy 1 first: the summary's word wins (the runner ranked all recent episodes)
    path, models = multi_policy_experiment(tmp_path, "pop", [10.0, 50.0, 20.0], best_policy=2)
    with sf_core_log() as messages:
        loaded = load_checkpoint(path)
    assert loaded.policy_index == 2 and loaded.version == 12
    assert os.path.dirname(loaded.path) == os.path.join(path, "checkpoint_p2")
    assert_same_weights(loaded.weights, models[2])
    assert loaded.hyperparams == pytest.approx({"learning_rate": 3e-4, "gamma": 0.97})
    assert any("policy 2 of 3" in m and "training_summary.json" in m for m in messages), messages
    with pytest.raises(AssertionError):  # the comparison can fail: the policies' weights differ
        assert_same_weights(loaded.weights, models[1])


def test_without_a_summary_the_highest_checkpoint_mean_return_is_loaded(tmp_path):
    path, models = multi_policy_experiment(tmp_path, "pop", [10.0, None, 30.0, 20.0])
    with sf_core_log() as messages:
        loaded = load_checkpoint(path, "best")
    assert loaded.policy_index == 2 and os.path.basename(loaded.path) == checkpoint.BEST
    assert_same_weights(loaded.weights, models[2])
    assert any("policy 2 of 4" in m and "30.00" in m for m in messages), messages

    # a summary naming a policy whose folder is gone: the checkpoints decide, and the log says why
    with open(os.path.join(path, "training_summary.json"), "w") as f:
        json.dump({"best_policy": 2}, f)
    shutil.rmtree(checkpoint.checkpoint_dir(path, 2, 4))
    with sf_core_log() as messages:
        assert load_checkpoint(path).policy_index == 3
    assert any("names policy 2, which has no checkpoint" in m for m in messages), messages

    # no policy has finished an episode yet: the first one with a checkpoint
    path, _ = multi_policy_experiment(tmp_path, "young", [None, None])
    assert load_checkpoint(path).policy_index == 0


def test_policy_index_loads_that_policys_weights(tmp_path):
    path, models = multi_policy_experiment(tmp_path, "pop", [10.0, 50.0, 20.0], best_policy=1)
    for k, model in enumerate(models):
        loaded = load_checkpoint(path, "latest", policy_index=k)
        assert loaded.policy_index == k and loaded.version == 10 + k
        assert_same_weights(loaded.weights, model)
    # a checkpoint path: its folder says whose it is
    file = checkpoint.latest_checkpoint(checkpoint.checkpoint_dir(path, 0, 3))
    loaded = load_checkpoint(path, file)
    assert loaded.policy_index == 0
    assert_same_weights(loaded.weights, models[0])
    with pytest.raises(ConfigError, match="policy 0's but --policy_index=2"):
        load_checkpoint(path, file, policy_index=2)


def test_an_index_the_run_lacks_is_a_config_error_naming_what_exists(tmp_path):
    path, _ = multi_policy_experiment(tmp_path, "pop", [1.0, 2.0, 3.0], best_policy=2)
    with pytest.raises(ConfigError, match=r"--policy_index=3: .* trained 3 policies, so the index must be 0 to 2 "
                                          r"\(checkpoints in checkpoint_p0/, checkpoint_p1/, checkpoint_p2/\)"):
        load_checkpoint(path, policy_index=3)
    with pytest.raises(ConfigError, match="--policy_index=-1"):
        load_checkpoint(path, policy_index=-1)
    shutil.rmtree(checkpoint.checkpoint_dir(path, 1, 3))
    with pytest.raises(ConfigError, match=r"no checkpoint 'latest' in .*checkpoint_p1 "
                                          r"\(checkpoints in checkpoint_p0/, checkpoint_p2/\)"):
        load_checkpoint(path, policy_index=1)
    for k in (0, 2):
        shutil.rmtree(checkpoint.checkpoint_dir(path, k, 3))
    with pytest.raises(ConfigError, match="no checkpoint in .*it holds no checkpoint yet"):
        load_checkpoint(path)


def test_a_single_policy_run_loads_as_before(tmp_path):
    path, model, _, _ = random_policy_experiment(tmp_path, "one", "CartPole-v1", steps=50, encoder_mlp_layers=[16])
    for index in (None, 0):
        loaded = load_checkpoint(path, policy_index=index)
        assert loaded.policy_index == 0 and os.path.dirname(loaded.path) == os.path.join(path, "checkpoint")
        assert_same_weights(loaded.weights, model)
    with pytest.raises(ConfigError, match=r"trained 1 policy, so the index must be 0 \(checkpoints in checkpoint/\)"):
        load_checkpoint(path, policy_index=1)


def test_enjoy_records_the_policy_it_played(tmp_path):
    import sf_core.enjoy

    path, _ = multi_policy_experiment(tmp_path, "pop", [10.0, 50.0, 20.0], best_policy=1)
    common = [f"--train_dir={tmp_path}", "--experiment=pop", "--max_num_episodes=1", "--eval_deterministic=True"]
    for flags, expected in (([], 1), (["--policy_index=2"], 2)):
        assert sf_core.enjoy.main(common + flags) == 0
        with open(os.path.join(path, "eval_results.json")) as f:
            results = json.load(f)
        assert results["policy_index"] == expected and results["policy_version"] == 10 + expected
        assert os.path.dirname(results["checkpoint"]) == os.path.join(path, f"checkpoint_p{expected}")
    assert sf_core.enjoy.main(common + ["--policy_index=5"]) == 2  # a ConfigError: the usage exit code


def test_the_evaluator_chooses_once_for_all_its_workers(tmp_path):
    from sf_core.evaluation.evaluator import EvalError, check_policy

    path, _ = multi_policy_experiment(tmp_path, "pop", [10.0, 50.0, 20.0])
    assert check_policy(path, "latest") == 1
    assert check_policy(path, "best", 0) == 0
    with pytest.raises(EvalError, match="--policy_index=3"):
        check_policy(path, "latest", 3)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_evaluator_workers_act_with_the_policy_named_and_record_it(tmp_path):
    """Through a served env: the evaluator's worker process plays --policy_index's policy (the returns
    enjoy gets with it, on the same seeds), and every result line says which policy it was."""
    import sf_core.enjoy
    from tests import launch
    from tests.helpers import EnvServerProcess

    path, _ = multi_policy_experiment(tmp_path, "pop", [10.0, 50.0, 20.0], best_policy=1)
    local = {}
    for k in (1, 2):
        assert sf_core.enjoy.main([f"--train_dir={tmp_path}", "--experiment=pop", "--max_num_episodes=3",
                                   "--eval_deterministic=True", "--seed=5", f"--policy_index={k}"]) == 0
        with open(os.path.join(path, "eval_results.json")) as f:
            local[k] = json.load(f)["returns"]
    assert local[1] != local[2]  # else the check below could not tell the policies apart
    server = EnvServerProcess(tmp_path, "CartPole-v1", 1)
    try:
        server.start()
        tasks, out = tmp_path / "tasks.jsonl", tmp_path / "results.jsonl"
        tasks.write_text(json.dumps({"id": "t", "env": "CartPole-v1", "seed": 5, "episodes": 3}) + "\n")
        result = launch.run([f"--tasks={tasks}", f"--env_service={server.spec}", "--num_workers=1",
                             f"--train_dir={tmp_path}", "--experiment=pop", "--eval_deterministic=True",
                             "--policy_index=2", f"--output={out}"], 120, module="sf_core.evaluate")
        assert result.returncode == 0, result.stdout + result.stderr
        with open(out) as f:
            (line,) = [json.loads(text) for text in f]
        assert line["policy_index"] == 2 and line["returns"] == local[2]
    finally:
        server.kill()
