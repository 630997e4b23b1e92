"""What the console says: the model it built, the preset it applied, and which policy a figure belongs to."""

from __future__ import annotations

import gymnasium as gym

from sf_core.algo.model import ActorCritic, layer_summary
from sf_core.algo.model_spec import ModelSpec
from sf_core.run.presets import preset_for
from sf_core.run.stats import TrainingStats


def test_the_start_up_line_names_the_models_layers():
    mlp = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), ModelSpec(encoder_mlp_layers=(64, 64)))
    assert layer_summary(mlp) == "linear 4→64, linear 64→64, action 64→2, value 64→1"
    conv = ActorCritic(gym.spaces.Box(0, 255, (4, 84, 84), dtype="uint8"), gym.spaces.Discrete(6),
                       ModelSpec(use_rnn=True, encoder_conv_architecture="convnet_atari"))
    assert layer_summary(conv) == ("conv 4→32 8×8, conv 32→64 4×4, conv 64→64 3×3, linear 3136→512, "
                                   "grucell 512→128, action 128→6, value 128→1")


def test_a_preset_not_verified_here_says_so():
    assert preset_for("CartPole-v1").describe("CartPole-v1") == \
        "applied preset for CartPole-v1 (flags you pass override it)"
    assert preset_for("Acrobot-v1").describe("Acrobot-v1").endswith("(flags you pass override it)")
    for env in ("atari_pong", "Swimmer-v5", "HalfCheetah-v4"):  # HalfCheetah-v5's preset, verified on v5 only
        assert "not yet verified here" in preset_for(env).describe(env)
    for env in ("Hopper-v5", "Ant-v5", "Humanoid-v5", "Pusher-v5"):  # Pusher-v5 the family's: verified per id
        assert "verified" not in preset_for(env).describe(env)


def test_with_several_policies_every_version_is_named_by_its_policy():
    stats = TrainingStats(window=10, num_policies=3)
    stats.policies[1].version = 7
    stats.policies[1].returns.append(12.5)
    line = stats.console_line()
    assert "policy v" not in line and "policies' lag" in line
    assert "per policy: policy 0 return n/a at v0, policy 1 return 12.5 at v7, policy 2 return n/a at v0" in line
    one = TrainingStats(window=10).console_line()
    assert "policy v0 lag" in one and "per policy" not in one


def test_the_log_follows_stdout_after_a_caller_swaps_and_closes_it(capsys):
    import io
    import sys

    from sf_core.common.logs import log, setup_logging

    swapped, original = io.StringIO(), sys.stdout
    sys.stdout = swapped
    try:
        log.handlers.clear()  # as in a fresh process whose first training ran under a swapped stdout
        setup_logging()
        log.info("into the swapped stream")
    finally:
        sys.stdout = original
    swapped.close()
    log.info("after the swapped stream closed")
    out, err = capsys.readouterr()
    assert "after the swapped stream closed" in out and "Logging error" not in err


def test_a_run_shorter_than_a_console_interval_still_reports_its_rate():
    """The last line of a run of a second or two printed `fps 0`: the rate had only one point to go on."""
    import time

    from sf_core.contracts.signals import RolloutReport

    stats = TrainingStats(window=10)
    stats.add(RolloutReport(worker=0, frames=1000, episodes=[], env_seconds=0.1, env_faults=0))
    time.sleep(0.2)
    stats.add(RolloutReport(worker=0, frames=1000, episodes=[], env_seconds=0.1, env_faults=0))
    fps = stats.fps()
    assert 2000 / 1.0 < fps < 2000 / 0.19  # both reports' frames over the time since the first one came
    assert "fps 0 " not in stats.console_line()
