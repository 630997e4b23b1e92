"""Building the component topology: shared buffers, components, their hosts, and the signal connections.

Serial mode puts every component on the runner's loop. Async mode gives each rollout worker and
inference worker its own process, and the learner a process whose batcher runs on a second thread.
Every connection is made here, before any process starts (signal-slot-mp requires it).
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
from dataclasses import dataclass, field

import gymnasium as gym
import torch

from algo.algorithms import algorithm_builder
from algo.model import ActorCritic, ModelSpec
from envs.registry import EnvRegistry
from sf_core.batcher import Batcher
from sf_core.buffers import BufferLayout, DatasetBuffers, SharedWeights, TrajectoryBuffers, make_lock
from sf_core.component import Component, ComponentProcess, use_plain_pickle
from sf_core.heartbeat import Heartbeats
from sf_core.inference_worker import InferenceWorker
from sf_core.learner import Learner
from sf_core.rollout_worker import RolloutWorker
from signal_slot.signal_slot import EventLoop

log = logging.getLogger("sf_core")


@dataclass
class Topology:
    components: list[Component] = field(default_factory=list)
    processes: list[ComponentProcess] = field(default_factory=list)
    heartbeats: Heartbeats | None = None
    learner: Learner | None = None
    weights: SharedWeights | None = None
    host: dict[str, ComponentProcess] = field(default_factory=dict)  # component name -> its process (async)

    def dead_components(self) -> list[Component]:
        return [c for c in self.components if c.name in self.host and not self.host[c.name].is_alive()]


def start_method(requested: str, device: str) -> str:
    if requested != "auto":
        return requested
    if sys.platform.startswith("linux") and device == "cpu":
        # fork skips re-importing torch in every process (about 2 s on 2 cores); the runner keeps
        # itself fork-safe: one torch thread before forking, no CUDA, no helper threads yet
        return "fork"
    return "spawn"


def component_names(cfg) -> list[str]:
    return ([f"inference_worker_{i}" for i in range(cfg.policy_workers_per_policy)]
            + [f"rollout_worker_{w}" for w in range(cfg.num_workers)] + ["learner", "batcher"])


def build_components(cfg, runner: Component, registry: EnvRegistry, obs_space: gym.Space, action_space: gym.Space,
                model: ActorCritic, version: int, device: str, seed: int, checkpoint_dir: str,
                resume_from: str | None, agents_per_env: int = 1) -> Topology:
    ctx = multiprocessing.get_context(start_method(cfg.mp_start_method, device))
    layout = BufferLayout.from_config(cfg, agents_per_env)
    buffers = TrajectoryBuffers(layout, obs_space, action_space, model.rnn_state_size)
    datasets = DatasetBuffers(buffers, cfg.dataset_size() // cfg.rollout)
    weights = SharedWeights(model, make_lock(cfg.serial_mode, ctx))
    weights.version[0] = version
    log.info("model: %s parameters; buffers: %d trajectory slots of %d×%d steps",
             f"{sum(p.numel() for p in model.parameters()):,}", layout.num_slots, layout.rollout + 1,
             layout.rows_per_split)

    topology = Topology()
    topology.heartbeats = None if cfg.serial_mode else Heartbeats(component_names(cfg))
    hb = topology.heartbeats

    def host(name: str) -> tuple[EventLoop, ComponentProcess | None]:
        if cfg.serial_mode:
            return runner.event_loop, None
        proc = ComponentProcess(f"{name}_proc", ctx, cfg.torch_threads)
        topology.processes.append(proc)
        topology.host[name] = proc
        return proc.event_loop, proc

    inference = []
    for i in range(cfg.policy_workers_per_policy):
        loop, proc = host(f"inference_worker_{i}")
        inference.append(InferenceWorker(loop, i, cfg, buffers, weights, layout, obs_space, action_space, model.spec,
                                         device, seed, hb))
        if proc:
            proc.reporter = inference[-1]
    workers = []
    for w in range(cfg.num_workers):
        loop, proc = host(f"rollout_worker_{w}")
        workers.append(RolloutWorker(loop, w, cfg, registry, buffers, layout, seed, hb))
        if proc:
            proc.reporter = workers[-1]
    loop, proc = host("learner")
    learner = Learner(loop, cfg, datasets, weights, obs_space, action_space, model.spec, device, seed, checkpoint_dir,
                      resume_from, algorithm_builder(cfg.algo), hb)
    batcher_loop = runner.event_loop if cfg.serial_mode else use_plain_pickle(EventLoop("batcher_loop"))
    batcher = Batcher(batcher_loop, cfg, buffers, datasets, layout, hb)
    if proc:
        proc.reporter = learner
        proc.threads.append((batcher_loop, batcher))
        topology.host["batcher"] = proc

    topology.components = [*inference, *workers, learner, batcher]
    topology.weights = weights
    topology.learner = learner
    _connect(runner, topology.components, workers, inference, learner, batcher)
    return topology


def _connect(runner, components, workers, inference, learner, batcher) -> None:
    for i in inference:
        i.connect("flush_requests", i.flush_requests)
    for w, worker in enumerate(workers):
        server = inference[w % len(inference)]
        worker.connect("policy_request", server.policy_request)
        server.connect(f"advance_{w}", worker.advance)
        worker.connect("new_trajectories", batcher.new_trajectories)
        batcher.connect(f"slots_freed_{w}", worker.slots_freed)
    batcher.connect("batch_ready", learner.batch_ready)
    learner.connect("batch_consumed", batcher.batch_consumed)
    learner.connect("checkpoint_saved", runner.on_checkpoint_saved)
    runner.connect("save_checkpoint", learner.save_checkpoint)
    for component in components:
        component.connect("report", runner.on_report)
        component.connect("component_error", runner.on_component_error)
        runner.connect("stop", component.stop)


def initial_model(cfg, obs_space: gym.Space, action_space: gym.Space, seed: int,
                  state: dict | None) -> ActorCritic:
    torch.manual_seed(seed)
    model = ActorCritic(obs_space, action_space, ModelSpec.from_config(cfg))
    if state is not None:
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise ValueError(f"the checkpoint does not fit the model these flags describe: {exc}") from None
    return model
