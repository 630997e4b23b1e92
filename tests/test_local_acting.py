"""--inference_in_rollout_workers: each rollout worker runs the policy on its own envs, with no inference worker
(sf_core/sampling/local_acting.py)."""

from __future__ import annotations

import pytest

from sf_core.cli.arguments import parse_args
from sf_core.config import ConfigError
from tests.helpers import train

LOCAL = "--inference_in_rollout_workers=True"


@pytest.mark.parametrize("flags, refusal", [
    (["--num_policies=2"], "runs one policy in each rollout worker"),
    (["--ray_address=127.0.0.1:6379"], "with --ray_address pass --inference_in_rollout_workers=False"),
])
def test_what_acting_in_the_rollout_workers_cannot_serve_is_refused(flags, refusal):
    with pytest.raises(ConfigError, match=refusal):
        parse_args(["--env=CartPole-v1", LOCAL, *flags])


@pytest.mark.slow
def test_rollout_workers_acting_themselves_solve_cartpole_on_policy_with_no_inference_worker(tmp_path):
    code, summary = train(tmp_path, "--env=CartPole-v1", "--algo=PPO", LOCAL, "--async_rl=False", "--num_workers=2",
                          "--num_envs_per_worker=16", "--batch_size=512",  # a round of sampling is one dataset
                          "--seed=1", "--target_mean_return=400", "--train_for_seconds=120",
                          "--train_for_env_steps=10000000")
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, summary["mean_return"]
    assert summary["final_learner_stats"]["policy_lag_max"] == 0  # each worker acted with the newest weights
    accounting = summary["time_accounting"]
    assert "inference_worker" not in accounting and not summary["inference_versions"]  # none was started
    assert accounting["rollout_worker"]["seconds"]["forward"] > 0  # the workers' own forward passes


@pytest.mark.slow
def test_a_serial_run_acting_in_its_rollout_worker_solves_cartpole(tmp_path):
    code, summary = train(tmp_path, "--env=CartPole-v1", LOCAL, "--serial_mode=True", "--seed=2",
                          "--target_mean_return=400", "--train_for_seconds=120", "--train_for_env_steps=10000000")
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None, summary["mean_return"]

