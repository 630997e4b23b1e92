"""Values computed by the learner (`Config.values_at_learner`): with --recompute_values=True and a critic of its
own, the inference worker runs the actor alone, and no node of the learner's graph may read the values it no
longer writes."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from sf_core.algo.algorithms import check_values_source, ppo
from sf_core.algo.graph import Node
from sf_core.algo.model import ActorCritic, ModelSpec
from sf_core.algo.params import LearningParams
from sf_core.config import Config, ConfigError
from tests.test_device_io import act_once

SEPARATE = {"actor_critic_share_weights": False}


@pytest.mark.parametrize("flags, expected", [
    ({"recompute_values": True, **SEPARATE}, True),
    ({"recompute_values": False, **SEPARATE}, False),  # values come from acting, as PPO's do
    ({"recompute_values": True}, False),  # a shared body: the value head costs next to nothing
    ({"recompute_values": True, "use_rnn": True, **SEPARATE}, False),  # the critic's state is stepped in acting
])
def test_values_are_left_to_the_learner_only_for_a_feed_forward_critic_of_its_own(flags, expected):
    assert Config(env="x", **flags).values_at_learner() is expected


def test_the_actor_alone_gives_the_whole_models_action_parameters():
    obs_space, action_space = gym.spaces.Box(-1, 1, (5,)), gym.spaces.Box(-1, 1, (2,))
    model = ActorCritic(obs_space, action_space, ModelSpec.from_config(Config(env="x", **SEPARATE)))
    obs = torch.randn(7, 5)
    with torch.no_grad():
        torch.testing.assert_close(model.action_params(obs), model(obs)[0], rtol=0, atol=0)


def test_an_inference_worker_leaving_values_to_the_learner_acts_the_same_and_writes_no_values():
    both = act_once(False, **SEPARATE)
    actor_only = act_once(False, recompute_values=True, **SEPARATE)
    assert both["log_prob"].abs().sum() > 0 and both["behaviour_values"].abs().sum() > 0
    for key in ("actions", "log_prob", "policy_version"):
        torch.testing.assert_close(actor_only[key], both[key], rtol=0, atol=0, msg=key)
    assert not actor_only["behaviour_values"].any()  # never written: the buffers start at zero


def test_a_graph_reading_the_values_of_acting_is_refused_when_inference_leaves_them_out():
    cfg = Config(env="x", recompute_values=True, **SEPARATE)
    recomputing = ppo(LearningParams(recompute_values=True)).nodes
    check_values_source(cfg, recomputing)
    reader = Node("my_targets", "compute", ("behaviour_values", "rewards"), ("value_targets",), lambda ctx, x: x)
    with pytest.raises(ConfigError, match="my_targets"):
        check_values_source(cfg, recomputing + [reader])
    check_values_source(Config(env="x", **SEPARATE), [reader])  # inference writes them then
