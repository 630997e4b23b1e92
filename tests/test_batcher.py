"""The batcher's copy of trajectories into a learner dataset (sf_core/learning/batcher.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from sf_core.config import Config
from sf_core.contracts.buffers import BufferLayout, DatasetBuffers, TrajectoryBuffers
from sf_core.contracts.sample import FIELDS, SampleSpaces
from sf_core.learning.batcher import Batcher
from signal_slot.signal_slot import EventLoop


def test_trajectories_land_in_their_dataset_columns_time_major_whole_slots_or_scattered_rows():
    cfg = Config(env="x", num_workers=2, num_envs_per_worker=8, worker_num_splits=2, rollout=4, batch_size=16,
                 serial_mode=True)
    layout = BufferLayout.from_config(cfg)
    spaces = SampleSpaces(gym.spaces.Box(0, 255, (2, 3), np.uint8), gym.spaces.Discrete(3))
    buffers = TrajectoryBuffers(layout, spaces)
    generator = torch.Generator().manual_seed(0)
    for f in FIELDS:  # every field distinct, so a row or column out of place shows
        t = buffers[f.name]
        t.copy_(torch.randint(0, 100, t.shape, generator=generator).to(t.dtype))
    datasets = DatasetBuffers(spaces, cfg.rollout, num_trajectories=16)
    batcher = Batcher(EventLoop("batcher_test_loop", serial_mode=True), cfg, buffers, datasets, layout)
    # a whole slot (adjacent rows: one block copy), then rows of two slots out of order
    units = [(1, e) for e in range(4)] + [(3, 2), (3, 3), (0, 1), (2, 0), (2, 3)]
    batcher._copy(0, 5, units)
    for f in FIELDS:
        for column, (slot, env) in enumerate(units, start=5):
            expected = buffers[f.name][slot, :f.rows(cfg.rollout), env]
            torch.testing.assert_close(datasets[0][f.name][:, column], expected, rtol=0, atol=0, msg=f.name)
