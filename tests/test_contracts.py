"""The contracts between processes: the sample schema, the row-0 rule, and the typed signals."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from sf_core.config import Config
from sf_core.contracts import signals
from sf_core.contracts.buffers import BufferLayout, DatasetBuffers, TrajectoryBuffers
from sf_core.contracts.sample import (BATCH_KEYS, CARRIED, FIELDS, RowOrigin, RowRuleError, SampleSpaces,
                                      batch_tensors, check_request)

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)
SPACES = SampleSpaces(OBS, gym.spaces.Discrete(2), rnn_state_size=4)


def small_layout() -> BufferLayout:
    cfg = Config(env="x", num_workers=1, num_envs_per_worker=2, worker_num_splits=1, rollout=4, batch_size=8)
    return BufferLayout.from_config(cfg)


def test_buffers_datasets_and_batches_hold_every_field_with_the_schema_rows():
    layout = small_layout()
    buffers = TrajectoryBuffers(layout, SPACES)
    datasets = DatasetBuffers(buffers.spaces, buffers.layout.rollout, num_trajectories=2)
    batch = batch_tensors(SPACES, layout.rollout, 2)
    assert tuple(buffers.fields) == tuple(datasets[0]) == tuple(batch) == BATCH_KEYS
    for f in FIELDS:
        slot_tensor, dataset_tensor = buffers[f.name], datasets[0][f.name]
        assert slot_tensor.shape[1] == layout.rollout + 1  # every field has row T in a slot
        assert dataset_tensor.shape[0] == (layout.rollout + 1 if f.bootstrap else layout.rollout)
        assert dataset_tensor.shape[2:] == slot_tensor.shape[3:] and dataset_tensor.dtype == slot_tensor.dtype
        assert dataset_tensor.is_shared() and batch[f.name].shape == dataset_tensor.shape
    assert buffers["rnn_states"].shape[-1] == 4 and buffers["obs"].shape[-1] == 3
    # what a trajectory needs from its predecessor's last row: observation, the action already chosen
    # for it with its log-prob, value and version, the state it was chosen with, the agent's activity and
    # the policy acting for it
    assert set(CARRIED) == {"obs", "actions", "log_prob", "behaviour_values", "policy_version", "rnn_states",
                            "inactive", "policy_id"}


@pytest.mark.parametrize("row, origin, truncation", [
    (0, RowOrigin.AFTER_STEP, False),  # a step never fills row 0
    (3, RowOrigin.AFTER_RESET, False),  # a reset starts at row 0
    (3, RowOrigin.CARRIED, False),  # only row 0 is carried
    (0, RowOrigin.AFTER_RESET, True),  # only a step truncates
    (0, RowOrigin.CARRIED, True),
])
def test_requests_that_break_the_row_0_rule_are_refused(row, origin, truncation):
    with pytest.raises(RowRuleError, match="row-0 rule"):
        check_request(row, int(origin), truncation)


@pytest.mark.parametrize("row, origin, truncation", [
    (0, RowOrigin.AFTER_RESET, False), (0, RowOrigin.CARRIED, False), (1, RowOrigin.AFTER_STEP, True),
    (4, RowOrigin.AFTER_STEP, False)])
def test_requests_that_keep_the_rule_pass(row, origin, truncation):
    check_request(row, int(origin), truncation)


def _recurrent_inference_worker():
    from sf_core.algo.model import ActorCritic, ModelSpec
    from sf_core.contracts.buffers import NoLock, SharedWeights
    from sf_core.sampling.inference_worker import InferenceWorker
    from signal_slot.signal_slot import EventLoop

    cfg = Config(env="x", num_workers=1, num_envs_per_worker=2, worker_num_splits=1, rollout=4, batch_size=8,
                 use_rnn=True, rnn_size=4, serial_mode=True)
    layout = BufferLayout.from_config(cfg)
    spec = ModelSpec.from_config(cfg)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), spec)
    buffers = TrajectoryBuffers(layout, SampleSpaces(OBS, gym.spaces.Discrete(2), model.rnn_state_size))
    weights = SharedWeights(model, NoLock())
    worker = InferenceWorker(EventLoop("test_inference_loop", serial_mode=True), 0, cfg, buffers, weights, layout,
                             OBS, gym.spaces.Discrete(2), spec, "cpu", seed=0)
    worker.on_start()
    return worker, buffers


def test_each_row_origin_acts_with_its_recurrent_state():
    """After a reset the state is zero; a carried row 0 (sync mode acting again with new weights) keeps
    the state it was recorded with, not zero (which would wipe the policy's memory every rollout);
    after a step, the env's latest state, zeroed where its episode ended on the previous row."""
    worker, buffers = _recurrent_inference_worker()
    recorded = torch.arange(1.0, 9.0).view(2, 4)
    latest = torch.full((2, 4), 7.0)

    def act(slot, row, origin, ended=(False, False)):
        buffers["rnn_states"][slot, 0] = recorded
        buffers.rnn_latest[0] = latest
        buffers["dones"][slot, max(row - 1, 0)] = torch.tensor(ended)
        worker.policy_request(0, 0, slot, row, int(origin), False)
        worker.flush_requests()
        return buffers["rnn_states"][slot, row].clone()

    assert not act(0, 0, RowOrigin.AFTER_RESET).any()
    torch.testing.assert_close(act(1, 0, RowOrigin.CARRIED), recorded)
    state = act(0, 2, RowOrigin.AFTER_STEP, ended=(True, False))
    assert not state[0].any()
    torch.testing.assert_close(state[1], latest[1])


def test_a_slot_whose_parameters_differ_from_the_payload_cannot_be_connected():
    from signal_slot.signal_slot import EventLoop, EventLoopObject

    class Receiver(EventLoopObject):
        def new_trajectories(self, slot_index):  # the payload names it `slot`
            pass

        def batch_ready(self, index):
            pass

    loop = EventLoop("test_contract_loop", serial_mode=True)
    sender, receiver = EventLoopObject(loop, "sender"), Receiver(loop, "receiver")
    with pytest.raises(TypeError, match="cannot receive signal 'new_trajectories'"):
        signals.NEW_TRAJECTORIES.connect(sender, receiver.new_trajectories)
    signals.BATCH_READY.connect(sender, receiver.batch_ready)


def test_a_payload_passed_by_keyword_is_refused_not_dropped():
    """signal-slot-mp delivers positional arguments only: a keyword would vanish on the way."""
    from signal_slot.signal_slot import EventLoop, EventLoopObject

    sender = EventLoopObject(EventLoop("test_keyword_loop", serial_mode=True), "sender")
    with pytest.raises(TypeError, match="positionally"):
        signals.BATCH_READY.emit(sender, index=3)
    with pytest.raises(TypeError, match="positionally"):
        signals.ADVANCE.emit_to(sender, 0, splits=[1])
    signals.BATCH_READY.emit(sender, 3)  # positional: fine (no receiver connected)


def test_every_signal_is_declared_once_with_a_meaning():
    names = [s.name for s in signals.ALL]
    assert len(names) == len(set(names))
    assert all(s.meaning and s.sender and s.receiver for s in signals.ALL)


def test_component_processes_carry_short_os_names():
    """`ps` and psutil tell the components apart by name (Linux keeps 15 characters of it)."""
    from sf_core.common.process_name import process_title

    assert process_title("rollout_worker_12_proc") == "sf:rw12"
    assert process_title("inference_worker_p1_0_proc") == "sf:infp1_0"
    assert process_title("learner_proc") == "sf:learner"
    assert len(process_title("a_component_with_a_long_name_proc")) == 15
