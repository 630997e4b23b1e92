"""Learner: trains on each dataset the batcher prepares and publishes the new weights.

Signals in:  batch_ready(index)   from the batcher
             save_checkpoint(runner_state, is_best)   from the runner
             stop()
Signals out: batch_consumed(index)   to the batcher (after the new weights are published)
             checkpoint_saved(path), report(stats), component_error(...)   to the runner

The algorithm itself (targets, losses, SGD) is `algo.appo.APPO`; this module only moves data.
"""

from __future__ import annotations

import time

import gymnasium as gym
import torch

from algo.appo import APPO, APPOParams
from algo.model import ActorCritic, ModelSpec
from sf_core import checkpoint
from sf_core.buffers import DatasetBuffers, SharedWeights
from sf_core.component import Component, guarded
from sf_core.heartbeat import Heartbeats
from signal_slot.signal_slot import EventLoop


class Learner(Component):
    def __init__(self, loop: EventLoop, cfg, datasets: DatasetBuffers, weights: SharedWeights,
                 obs_space: gym.Space, action_space: gym.Space, device: str, seed: int,
                 checkpoint_dir: str, resume_from: str | None, heartbeats: Heartbeats | None = None):
        super().__init__(loop, "learner", heartbeats)
        self.checkpoint_dir, self.resume_from = checkpoint_dir, resume_from
        self.cfg, self.datasets, self.weights = cfg, datasets, weights
        self.obs_space, self.action_space, self.device, self.seed = obs_space, action_space, device, seed
        self.version = 0
        self.samples_trained = 0
        self.algo: APPO | None = None
        self.batcher_loop: EventLoop | None = None  # runs on a thread of this process (async mode)
        loop.start.connect(self.on_start)

    @guarded
    def on_start(self) -> None:
        torch.manual_seed(self.seed)
        model = ActorCritic(self.obs_space, self.action_space, ModelSpec.from_config(self.cfg)).to(self.device)
        self.weights.load_into(model)
        self.version = self.weights.current_version()
        cfg = self.cfg
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps,
                                     betas=(cfg.adam_beta1, cfg.adam_beta2))
        self.algo = APPO(model, optimizer, APPOParams.from_config(cfg),
                         on_minibatch=lambda: self.beat("training on a dataset"))
        if self.resume_from:
            state = checkpoint.load(self.resume_from, map_location=self.device)
            optimizer.load_state_dict(state["optimizer"])
            self.samples_trained = state["samples_trained"]
            checkpoint.restore_rng(state["rng"])

    @guarded
    def save_checkpoint(self, runner_state: dict, is_best: bool) -> None:
        if self.algo is None:
            return
        self.beat("saving a checkpoint")
        state = {
            "version": self.version,
            "model": self.algo.model.state_dict(),
            "optimizer": self.algo.optimizer.state_dict(),
            "samples_trained": self.samples_trained,
            "learning_rate": self._learning_rate(),
            "rng": checkpoint.rng_state(),
            "runner": runner_state,
        }
        path = checkpoint.save(self.checkpoint_dir, state, self.cfg.keep_checkpoints, is_best)
        self.emit("checkpoint_saved", path)

    def _learning_rate(self) -> float:
        if self.cfg.lr_schedule == "linear_decay":
            progress = self.samples_trained * self.cfg.env_frameskip / self.cfg.train_for_env_steps
            return self.cfg.learning_rate * max(0.0, 1.0 - progress)
        return self.cfg.learning_rate

    @guarded
    def batch_ready(self, index: int) -> None:
        if self.cfg.sampling_only:  # benchmarking the sampler: hand the data straight back
            self.emit("batch_consumed", index)
            return
        started = time.perf_counter()
        self.beat("training on a dataset")
        dataset = self.datasets[index]
        data = {key: t.to(self.device, non_blocking=True) for key, t in dataset.items()}
        data = {key: (t if key == "obs" else t[:-1]) for key, t in data.items()}  # obs keeps the bootstrap row
        lr = self._learning_rate()
        for group in self.algo.optimizer.param_groups:
            group["lr"] = lr
        stats = self.algo.train(data, self.version)
        self.version += 1
        self.weights.publish(self.algo.model, self.version)
        self.emit("batch_consumed", index)

        samples = data["rewards"].numel()
        self.samples_trained += samples
        self.emit("report", {"source": "learner", "version": self.version, "samples": samples,
                             "train_seconds": time.perf_counter() - started, "learning_rate": lr, **stats})

    @guarded
    def stop(self) -> None:
        self.stop_loop()
