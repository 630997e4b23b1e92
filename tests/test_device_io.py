"""The staging path a GPU's inference takes (sf_core/sampling/device_io.py), run on the CPU: pinned memory aside, the
same gathers, copies and buffer reuse, and an inference worker that acts through it writes what the direct
path writes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from sf_core.config import Config
from sf_core.contracts.sample import RowOrigin
from sf_core.sampling.device_io import DeviceIO

STAGED = DeviceIO("cpu", staged=True, pin=False)


def test_a_gather_of_whole_splits_and_one_of_single_env_rows_match_numpy():
    source = np.random.default_rng(0).integers(0, 255, size=(4, 5, 3, 2, 2), dtype=np.uint8)
    slots, rows = np.array([3, 0, 3]), np.array([1, 4, 2])
    for index in [(slots, rows), (slots, rows, np.array([2, 0, 1]))]:
        expected = source[index].reshape(-1, 2, 2)
        io = DeviceIO("cpu", staged=True, pin=False)
        got = io.gather("obs", source, index, (2, 2))
        assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), expected)
        assert np.array_equal(DeviceIO("cpu").gather("obs", source, index, (2, 2)).numpy(), expected)


def test_staging_buffers_are_reused_and_grow_for_a_larger_batch():
    io = DeviceIO("cpu", staged=True, pin=False)
    source = np.arange(40, dtype=np.float32).reshape(10, 4)
    first = io.gather("obs", source, (np.array([1, 2]),), (4,))
    again = io.gather("obs", source, (np.array([5]),), (4,))
    assert again.data_ptr() == first.data_ptr() and np.array_equal(again.numpy(), source[[5]])
    bigger = io.gather("obs", source, (np.arange(7),), (4,))
    assert io.buffers["obs"].shape[0] == 7 and np.array_equal(bigger.numpy(), source[:7])


def test_outputs_come_back_as_numpy_of_their_dtype():
    outputs = {"actions": torch.tensor([1, 0, 2]), "values": torch.tensor([0.5, -1.0, 2.0]),
               "rnn": torch.ones(3, 4)}
    host = STAGED.to_host(outputs)
    for name, t in outputs.items():
        assert host[name].dtype == t.numpy().dtype and np.array_equal(host[name], t.numpy())


def act_once(use_rnn: bool, io: DeviceIO | None = None, device: str = "cpu", **flags) -> dict[str, torch.Tensor]:
    """One flush of two requests (a whole split after a step, another after a reset) by an inference worker on
    `device`, with its own DeviceIO or `io`; returns every field it writes."""
    from sf_core.algo.model import ActorCritic, ModelSpec
    from sf_core.contracts.buffers import BufferLayout, NoLock, SharedWeights, TrajectoryBuffers
    from sf_core.contracts.sample import SampleSpaces
    from sf_core.sampling.inference_worker import InferenceWorker
    from signal_slot.signal_slot import EventLoop

    obs, actions = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(3)
    cfg = Config(env="x", num_workers=1, num_envs_per_worker=4, worker_num_splits=2, rollout=4, batch_size=8,
                 use_rnn=use_rnn, rnn_size=4, serial_mode=True, **flags)
    layout, spec = BufferLayout.from_config(cfg), ModelSpec.from_config(cfg)
    torch.manual_seed(1)
    model = ActorCritic(obs, actions, spec)
    buffers = TrajectoryBuffers(layout, SampleSpaces(obs, actions, model.rnn_state_size))
    buffers["obs"].copy_(torch.randn(buffers["obs"].shape))
    buffers.rnn_latest.copy_(torch.randn(buffers.rnn_latest.shape))
    before = buffers.rnn_latest.clone()
    loop = EventLoop(f"io_loop_{use_rnn}_{io is None}_{device}_{sorted(flags.items())}", serial_mode=True)
    worker = InferenceWorker(loop, 0, cfg,
                             buffers, SharedWeights(model, NoLock()), layout, obs, actions, spec, device, seed=0)
    worker.on_start()
    if io is not None:
        worker.actor.io = io
    torch.manual_seed(5)  # the same action samples
    worker.policy_request(0, 1, 1, 2, int(RowOrigin.AFTER_STEP), False)
    worker.policy_request(0, 0, 0, 0, int(RowOrigin.AFTER_RESET), False)
    worker.flush_requests()
    if use_rnn:  # both splits acted: a recurrent policy's new state is each env's latest
        assert not torch.equal(buffers.rnn_latest[:2], before[:2])
    written = {key: buffers[key].clone() for key in ("actions", "log_prob", "behaviour_values", "policy_version",
                                                     "rnn_states")}
    return written | {"rnn_latest": buffers.rnn_latest.clone()}


@pytest.mark.parametrize("use_rnn", [False, True], ids=["feed_forward", "gru"])
def test_an_inference_worker_writes_the_same_rows_through_staging(use_rnn):
    direct = act_once(use_rnn)
    staged = act_once(use_rnn, DeviceIO("cpu", staged=True, pin=False))
    assert direct["log_prob"].abs().sum() > 0  # the rows were acted on
    for key in direct:
        torch.testing.assert_close(staged[key], direct[key], rtol=0, atol=0, msg=key)
