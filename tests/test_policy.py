"""The policy loader (sf_core/evaluation/policy.py) shared by sf_core.enjoy and the evaluator: the saved model
rebuilt and acting on packed Dict observations, one recurrent state per episode, clear load errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.observations import ObsWriter
from sf_core.config import Config, ConfigError
from sf_core.evaluation.policy import load_checkpoint
from sf_core.records import checkpoint
from sf_core.records.experiment import Experiment
from tests.service_envs import DictMemoryCue


def save_experiment(tmp_path, **flags) -> tuple[str, Config]:
    """An experiment folder with config.json and, unless with_checkpoint=False, one checkpoint of a fresh model."""
    with_checkpoint = flags.pop("with_checkpoint", True)
    cfg = Config(env="DictMemoryCue-v0", train_dir=str(tmp_path), experiment="exp", **flags)
    experiment = Experiment(cfg)
    experiment.prepare(resuming=False)
    if with_checkpoint:
        env = DictMemoryCue()
        torch.manual_seed(0)
        model = ActorCritic(env.observation_space, env.action_space, ModelSpec.from_config(cfg))
        state = {"model": model.state_dict(), "version": 7, "runner": {"frames": 100}}
        checkpoint.save(checkpoint.checkpoint_dir(experiment.path), state, keep=2, is_best=False)
    return experiment.path, cfg


def observations(seed: int) -> list:
    env = DictMemoryCue()
    obs, _ = env.reset(seed=seed)
    seen, done = [obs], False
    while not done:
        obs, _, done, _, _ = env.step(0)
        seen.append(obs)
    return seen[:-1]  # the ones acted on


def test_interleaved_episodes_keep_their_own_state_and_match_the_saved_model(tmp_path):
    path, cfg = save_experiment(tmp_path, use_rnn=True, rnn_size=8, encoder_mlp_layers=[16])
    loaded = load_checkpoint(path, "latest")
    assert loaded.version == 7 and loaded.cfg.use_rnn
    env = DictMemoryCue()
    policy = loaded.policy(env.observation_space, env.action_space, deterministic=True)

    # the reference: the saved model stepped by hand, one episode at a time, on rows packed as rollout workers do
    model = ActorCritic(env.observation_space, env.action_space, ModelSpec.from_config(cfg))
    model.load_state_dict(checkpoint.load(loaded.path)["model"])
    writer, episodes = ObsWriter(env.observation_space), [observations(1), observations(2)]
    expected = []
    for seen in episodes:
        state, states = model.initial_state(1), []
        for obs in seen:
            row = np.zeros((1, writer.packed.nbytes), np.uint8)
            writer.write(obs, row[0])
            with torch.no_grad():
                _, _, state = model.step(torch.from_numpy(row), state)
            states.append(state)
        expected.append(states)

    # two episodes at once on the one policy, as two evaluator task threads do
    first, second = policy.start_episode(), policy.start_episode()
    for t, (a, b) in enumerate(zip(*episodes)):
        action = policy.act([a], first)[0]
        assert isinstance(action, int) and 0 <= action < 4  # what env.step takes
        policy.act([b], second)
        torch.testing.assert_close(first.rnn, expected[0][t], rtol=0, atol=0)
        torch.testing.assert_close(second.rnn, expected[1][t], rtol=0, atol=0)
    assert not torch.equal(first.rnn, second.rnn)  # different cues remembered

    # several agents in one state (self-play): a finished agent's row starts again from zeros
    both = policy.start_episode(agents=2)
    policy.act([episodes[0][0], episodes[1][0]], both)
    torch.testing.assert_close(both.rnn, torch.cat([expected[0][0], expected[1][0]]))
    both.agent_done(0)
    assert not both.rnn[0].any() and both.rnn[1].any()


def test_missing_checkpoint_and_unregistered_custom_model_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no experiment at"):
        load_checkpoint(str(tmp_path / "nothing"))
    path, _ = save_experiment(tmp_path / "empty", with_checkpoint=False)
    with pytest.raises(ConfigError, match="no checkpoint 'best'"):
        load_checkpoint(path, "best")
    path, _ = save_experiment(tmp_path / "custom", with_checkpoint=False, encoder_custom="never_registered")
    with pytest.raises(ConfigError, match="never_registered.*run from a script that registers it"):
        load_checkpoint(path)


@pytest.mark.parametrize("mixed_precision, fast, expected", [
    (True, False, "bfloat16 is emulated there, slower than float32"),
    (False, True, "--mixed_precision=True trains up to ~2x faster"),
    (True, True, None), (False, False, None)])
def test_the_start_up_says_where_bfloat16_pays_off_and_where_it_costs(monkeypatch, caplog, mixed_precision, fast,
                                                                       expected):
    import logging

    import sf_core.machine.device

    # the hardware, not the advice
    monkeypatch.setattr(sf_core.machine.device, "has_fast_bfloat16", lambda device: fast)
    with caplog.at_level(logging.INFO, logger="sf_core"):
        assert sf_core.machine.device.training_device(Config(env="x", mixed_precision=mixed_precision)) == "cpu"
    said = " ".join(r.getMessage() for r in caplog.records)
    assert (expected in said) if expected else "bfloat16" not in said
