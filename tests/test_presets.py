"""Every classic-control preset solves its env with no flag but the target: the command a newcomer types."""

from __future__ import annotations

import pytest

from sf_core.run.presets import PRESETS, VERIFIED
from tests import launch
from tests.helpers import read_summary

# env -> (the usual "solved" mean return, a wall-clock bound for this 2-core box with room for a loaded CI)
SOLVED = {"CartPole-v1": (475.0, 90), "Acrobot-v1": (-100.0, 150), "Pendulum-v1": (-200.0, 240)}


def test_every_verified_preset_exists_and_the_classic_ones_are_tested():
    assert set(VERIFIED) <= set(PRESETS)
    assert set(SOLVED) <= set(VERIFIED)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("env", sorted(SOLVED))
def test_a_classic_control_preset_solves_its_env_with_no_flags(env, tmp_path):
    target, seconds = SOLVED[env]
    result = launch.run([f"--env={env}", f"--target_mean_return={target:g}", f"--train_for_seconds={seconds}",
                         f"--train_dir={tmp_path}", "--experiment=preset", "--seed=1"], timeout=seconds + 60)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(tmp_path, "preset")
    assert summary["time_to_target"] is not None, (env, summary.get("mean_return"), summary.get("frames"))
    assert summary["mean_return_at_target"] >= target
