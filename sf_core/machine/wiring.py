"""Building the component topology: shared buffers, components, their hosts, and the signal connections.

Serial mode puts every component on the runner's loop. Async mode gives each rollout worker and
inference worker its own process, and each policy's learner a process whose batcher runs on a second
thread. Rollout workers and trajectory buffers are shared by all policies (--num_policies); each
policy has its own weights, inference workers, datasets, batcher and learner. With --num_learners=N the
learner is rank 0 of a learner group whose ranks 1..N-1 are plain processes beside it
(sf_core/learning/group/).
Every connection is made here, before any process starts (signal-slot-mp requires it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Callable, Sequence

import gymnasium as gym
import torch

from sf_core.algo.conv_encoders import conv_summaries
from sf_core.algo.distributions import action_storage
from sf_core.algo.model import ActorCritic, ModelSpec, layer_summary
from sf_core.algo.observations import obs_storage
from sf_core.algo.registry import algorithm_builder
from sf_core.common.forking import frozen_heap
from sf_core.envs.env_check import check_env
from sf_core.envs.multi_agent import is_multi_agent, num_agents
from sf_core.envs.registry import EnvContext, EnvRegistry
from sf_core.envs.vector_backends import probe_env, vector_backend
from sf_core.common.user_code import UserCode
from sf_core.config import Config, ConfigError
from sf_core.contracts import signals as sig
from sf_core.contracts.buffers import BufferLayout, DatasetBuffers, SharedWeights, TrajectoryBuffers, make_lock
from sf_core.contracts.component import Component, ComponentProcess, Routing
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.sample import SampleSpaces
from sf_core.learning.batcher import Batcher, batcher_name
from sf_core.learning.group import followers, link
from sf_core.learning.learner import Learner, learner_name
from sf_core.machine.start_method import mp_context, start_method
from sf_core.sampling import policy_mapping
from sf_core.sampling.inference_worker import InferenceWorker
from sf_core.sampling.local_acting import LocalPolicy
from sf_core.sampling.periodic_evaluator import EVALUATOR, Evaluator
from sf_core.sampling.rollout_worker import RolloutWorker
from sf_core.service import training as services
from signal_slot.signal_slot import EventLoop

log = logging.getLogger("sf_core")


@dataclass
class Topology:
    components: list[Component] = field(default_factory=list)
    # every component process, and the other ranks of a learner group (plain processes)
    processes: list[ComponentProcess | BaseProcess] = field(default_factory=list)
    control: ControlBlock | None = None
    learners: list[Learner] = field(default_factory=list)  # one per policy
    weights: list[SharedWeights] = field(default_factory=list)  # one per policy
    host: dict[str, ComponentProcess] = field(default_factory=dict)  # component name -> its process (async)
    evaluator: Evaluator | None = None  # --eval_every_env_steps

    def pids(self) -> dict[str, int | None]:
        """Each component's process id (async mode): what a running training_summary.json lists, for a benchmark
        or a fault drill (scripts/worker_recovery.py) to find a component's process by its name."""
        return {name: proc.pid for name, proc in self.host.items()}

    def dead_components(self) -> list[Component]:
        return [c for c in self.components if c.name in self.host and not self.host[c.name].is_alive()]

    def dead_learner_rank(self) -> ComponentProcess | BaseProcess | None:
        """A learner group's rank that died (not one that ended on rank 0's stop): the cause of the error rank
        0's next collective raises."""
        return next((p for p in self.processes if p.name.startswith(followers.RANK_PREFIX) and not p.is_alive()
                     and p.exitcode != 0), None)

    def stop_processes(self, grace: float, heartbeat_timeout: float, unreachable: Sequence[str] = ()) -> None:
        """Wait up to `grace` seconds for every process to stop (the learner saves first), then kill what is
        left. A process with a stalled heartbeat is stuck in a slot (an env that never returns) and cannot
        stop: it is not waited for, but still outlives the others, so nothing it shares goes from under them.
        Nor is one whose main loop's queue a dead process left locked (`unreachable` components: the stop
        signal could not reach them), which waits inside that queue for good."""
        deadline = time.time() + grace
        locked = {self.host[c.name].name for c in self.components if c.name in unreachable and c.name in self.host
                  and c.event_loop is self.host[c.name].event_loop}
        stuck = self.stuck_processes(heartbeat_timeout) | locked
        # re-read the heartbeats while waiting: a worker whose env hung a moment after another's is found
        # stuck within the grace period, not waited out
        while time.time() < deadline:
            waiting = [p for p in self.processes if p.is_alive() and p.name not in stuck]
            if not waiting:
                break
            waiting[0].join(timeout=min(0.2, max(0.0, deadline - time.time())))
            stuck = self.stuck_processes(heartbeat_timeout) | locked
        for proc in self.processes:
            if proc.is_alive():  # components ignore SIGTERM (see component.configure_process): kill
                if proc.name in locked:
                    log.warning("%s waits for good on a queue a dead process left locked: killing it", proc.name)
                elif proc.name in stuck:
                    log.warning("%s is stuck (no heartbeat): killing it", proc.name)
                else:
                    log.warning("%s did not stop in %.0fs: killing it", proc.name, grace)
                proc.kill()
                proc.join(timeout=2.0)

    def stuck_processes(self, heartbeat_timeout: float) -> set[str]:
        if self.control is None or self.control.heartbeats is None:  # serial mode: no processes to be stuck
            return set()
        stalled = self.control.heartbeats.stalled(heartbeat_timeout)
        return {self.host[name].name for name, _, _ in stalled if name in self.host}

    def start_processes(self) -> None:
        with frozen_heap():  # the children leave this process's garbage to it
            for proc in self.processes:
                proc.start()

    def close_processes(self) -> None:
        for proc in self.processes:
            with contextlib.suppress(ValueError):  # never started
                proc.close()


@dataclass
class PolicyComponents:
    """What one policy has of its own: inference workers, a batcher and a learner."""

    inference: list[InferenceWorker]
    batcher: Batcher
    learner: Learner | Component  # where datasets leave the machine (a cluster node), a DatasetSink's component


@dataclass
class DatasetSink:
    """What takes the learner's place where the datasets leave this machine (a cluster node's sampler sends each
    as a shard to the driver): one component per policy, which takes batch_ready and emits batch_consumed once
    the dataset is copied out."""

    name: Callable[[int, int], str]  # (policy, num_policies) -> the component's name
    build: Callable[[EventLoop, DatasetBuffers, ControlBlock, int, int], Component]  # (loop, datasets, control, p, n)


def share_policy_processes(cfg: Config) -> bool:
    """--policy_processes resolved: whether the components of several policies share processes."""
    if cfg.num_policies == 1 or cfg.policy_processes == "own":
        return False
    if cfg.policy_processes == "shared":
        return True
    own = cfg.num_workers + cfg.num_policies * (cfg.policy_workers_per_policy + 1)
    return own > (os.cpu_count() or 1)


def component_names(cfg: Config, sink: DatasetSink | None = None) -> list[str]:
    """Every component's name (a heartbeat each); with a `sink`, its components instead of the learners."""
    n = cfg.num_policies
    learners = [(sink.name if sink else learner_name)(p, n) for p in range(n)]
    return ([sig.inference_worker_name(p, i, n) for p in range(n) for i in range(inference_workers(cfg))]
            + [f"rollout_worker_{w}" for w in range(cfg.num_workers)]
            + learners + [batcher_name(p, n) for p in range(n)]
            + ([EVALUATOR] if cfg.eval_every_env_steps and sink is None else []))


def inference_workers(cfg: Config) -> int:
    """Inference workers per policy: none where the rollout workers run the policy themselves."""
    return 0 if cfg.inference_in_rollout_workers else cfg.policy_workers_per_policy


@dataclass
class Setup:
    """What every component is built from: the run's config, spaces, devices and where each policy starts."""

    cfg: Config
    registry: EnvRegistry
    obs_space: gym.Space
    action_space: gym.Space
    models: list[ActorCritic]  # each policy's initial model
    versions: list[int]
    device: str
    seed: int
    checkpoint_dirs: list[str]
    resume_from: list[str | None]
    agents_per_env: int = 1
    # on a cluster: (this sampler's index, how many samplers); --env_service slots go to every node's workers
    sampler: tuple[int, int] = (0, 1)


def build_components(setup: Setup, runner: Component, sink: DatasetSink | None = None) -> Topology:
    """The run's components. With a `sink` they are a cluster node's sampler (sf_core/cluster/sampler.py): no
    learner; the sink's components take each dataset."""
    cfg = setup.cfg
    ctx = mp_context(start_method(cfg.mp_start_method, setup.device, cfg.most_torch_threads()))
    layout = BufferLayout.from_config(cfg, setup.agents_per_env)
    spec = setup.models[0].spec
    buffers = TrajectoryBuffers(layout, SampleSpaces(setup.obs_space, setup.action_space, setup.models[0].rnn_state_size))
    control = ControlBlock(None if cfg.serial_mode else component_names(cfg, sink), cfg.num_workers,
                           cfg.num_policies * inference_workers(cfg))
    topology = Topology(control=control)
    for model, version in zip(setup.models, setup.versions):
        topology.weights.append(SharedWeights(model, make_lock(cfg.serial_mode, ctx)))
        topology.weights[-1].version[0] = version
    log.info("model: %s; %s parameters%s; buffers: %d trajectory slots of %d×%d steps",
             layer_summary(setup.models[0]), f"{sum(p.numel() for p in setup.models[0].parameters()):,}",
             f" (× {cfg.num_policies} policies)" if cfg.num_policies > 1 else "", layout.num_slots,
             layout.rollout + 1, layout.rows_per_split)

    shared: dict[str, ComponentProcess] = {}

    def host(name: str, group: str | None = None, threads: int | None = None
             ) -> tuple[EventLoop, ComponentProcess | None]:
        """The loop `name` runs on: the runner's (serial), its own process's (with `threads` torch threads, by
        default --torch_threads), or that of its group."""
        if cfg.serial_mode:
            return runner.event_loop, None
        if group is not None and group in shared:
            topology.host[name] = shared[group]
            return shared[group].event_loop, shared[group]
        proc = ComponentProcess(f"{group or name}_proc", ctx, threads or cfg.torch_threads)
        topology.processes.append(proc)
        topology.host[name] = proc
        if group is not None:
            shared[group] = proc
        return proc.event_loop, proc

    policies = [_build_policy(setup, p, buffers, layout, topology, control, host, runner, spec, sink)
                for p in range(cfg.num_policies)]
    learner = policies[0].learner
    # ranks 1..N-1 of its learner group, started after the learner's process
    if isinstance(learner, Learner) and learner.group is not None:
        topology.processes += followers.follower_processes(ctx, learner.group, learner.trainer, learner.datasets,
                                                           learner.weights, cfg.learner_threads())
    workers = _build_workers(setup, buffers, layout, topology, host, spec)
    # started in this order, as before several policies existed: inference, rollout workers, learners
    order = ("inference_worker", "rollout_worker")
    topology.processes.sort(key=lambda proc: next((k for k, kind in enumerate(order) if proc.name.startswith(kind)), 2))
    topology.components = [*workers, *(c for pc in policies for c in (*pc.inference, pc.learner, pc.batcher))]
    topology.learners = [pc.learner for pc in policies]
    if cfg.eval_every_env_steps and sink is None:
        loop, proc = host(EVALUATOR)
        add_evaluator(setup, topology, runner, loop, proc)
    _connect(runner, topology.components, workers, policies)
    return topology


def _build_workers(setup: Setup, buffers: TrajectoryBuffers, layout: BufferLayout, topology: Topology,
                   host: Callable, spec: ModelSpec) -> list[RolloutWorker]:
    cfg = setup.cfg
    mapping = policy_mapping.resolve(cfg.policy_mapping)
    local = (LocalPolicy(topology.weights[0], spec, (setup.obs_space, setup.action_space))
             if cfg.inference_in_rollout_workers else None)
    workers = []
    for w in range(cfg.num_workers):
        loop, proc = host(f"rollout_worker_{w}")
        workers.append(RolloutWorker(loop, w, cfg, setup.registry, buffers, layout, setup.seed, topology.control,
                                     mapping, setup.sampler, local))
        if proc:
            proc.reporter = workers[-1]
    return workers


def add_evaluator(setup: Setup, topology: Topology, runner: Component, loop: EventLoop,
                  proc: ComponentProcess | None) -> None:
    """--eval_every_env_steps: the evaluator (sf_core/sampling/periodic_evaluator.py), on `loop`; its report, error
    and stop connections are made with every other component's."""
    evaluator = Evaluator(loop, setup.cfg, setup.registry, setup.obs_space, setup.action_space,
                          setup.models[0].spec, topology.control)
    if proc:
        proc.reporter = evaluator
    topology.evaluator = evaluator
    topology.components.append(evaluator)
    sig.EVALUATE.connect(runner, evaluator.evaluate)


def _build_policy(setup: Setup, p: int, buffers: TrajectoryBuffers, layout: BufferLayout, topology: Topology,
                  control: ControlBlock, host: Callable, runner: Component, spec: ModelSpec,
                  sink: DatasetSink | None) -> PolicyComponents:
    cfg, n = setup.cfg, setup.cfg.num_policies
    seed = setup.seed + 1_000_003 * p
    weights = topology.weights[p]
    inference = []
    share = share_policy_processes(cfg)
    for i in range(inference_workers(cfg)):
        loop, proc = host(sig.inference_worker_name(p, i, n), f"inference_worker_{i}" if share else None)
        inference.append(InferenceWorker(loop, i, cfg, buffers, weights, layout, setup.obs_space, setup.action_space,
                                         spec, setup.device, seed, control, p))
        if proc and proc.reporter is None:
            proc.reporter = inference[-1]
    datasets = DatasetBuffers(buffers.spaces, layout.rollout, cfg.dataset_size() // cfg.rollout)
    if sink is not None:  # a sampler: batcher and sink on the sampler's own loop, in the actor's process
        batcher = Batcher(runner.event_loop, cfg, buffers, datasets, layout, control, p)
        return PolicyComponents(inference, batcher, sink.build(runner.event_loop, datasets, control, p, n))
    loop, proc = host(learner_name(p, n), "learners" if share else None, cfg.learner_threads())
    group = link.plan(cfg, setup.device) if cfg.num_learners > 1 else None
    learner = Learner(loop, cfg, datasets, weights, setup.obs_space, setup.action_space, spec, setup.device, seed,
                      setup.checkpoint_dirs[p], setup.resume_from[p], algorithm_builder(cfg.algo), control,
                      p, topology.weights, group)
    batcher_loop = runner.event_loop if cfg.serial_mode else Routing.use_plain_pickle(EventLoop(f"batcher_loop_{p}"))
    batcher = Batcher(batcher_loop, cfg, buffers, datasets, layout, control, p)
    if proc:
        proc.reporter = proc.reporter or learner
        proc.threads.append((batcher_loop, batcher))
        topology.host[batcher.name] = proc
    return PolicyComponents(inference, batcher, learner)


def _connect(runner: Component, components: list[Component], workers: list[RolloutWorker],
             policies: list[PolicyComponents]) -> None:
    for p, pc in enumerate(policies):
        for i in pc.inference:
            sig.FLUSH_REQUESTS.connect(i, i.flush_requests)
        for w, worker in enumerate(workers):
            if pc.inference:  # else each rollout worker acts itself (act_locally, below)
                server = pc.inference[w % len(pc.inference)]
                sig.POLICY_REQUEST.connect_to(worker, p, server.policy_request)
                sig.ADVANCE.connect_to(server, w, worker.advance)
                sig.RESEND_REQUESTS.connect_to(server, w, worker.resend_requests)
            sig.NEW_TRAJECTORIES.connect_to(worker, p, pc.batcher.new_trajectories)
            sig.SLOTS_FREED.connect_to(pc.batcher, w, worker.slots_freed)
        sig.BATCH_READY.connect(pc.batcher, pc.learner.batch_ready)
        sig.BATCH_CONSUMED.connect(pc.learner, pc.batcher.batch_consumed)
        if isinstance(pc.learner, Learner):
            sig.CHECKPOINT_SAVED.connect(pc.learner, runner.on_checkpoint_saved)
            sig.SAVE_CHECKPOINT.connect_to(runner, p, pc.learner.save_checkpoint)
            sig.PBT_REPLACE.connect_to(runner, p, pc.learner.pbt_replace)
    for worker in workers:
        sig.ENVS_STEPPED.connect(worker, worker.envs_stepped)
        sig.ACT_LOCALLY.connect(worker, worker.act_locally)
    for component in components:
        sig.REPORT.connect(component, runner.on_report)
        sig.COMPONENT_ERROR.connect(component, runner.on_component_error)
        sig.STOP.connect(runner, component.stop)


def check_user_code(cfg: Config, registry: EnvRegistry) -> None:
    """Async mode: the env factory, model parts and algorithm users registered must reach the worker
    processes; one that cannot is named here, before any process starts."""
    registry.check_picklable()
    spec = ModelSpec.from_config(cfg)
    for part in (spec.encoder_factory, spec.core_factory, spec.decoder_factory, algorithm_builder(cfg.algo)):
        if isinstance(part, UserCode):
            part.check()


def probe_spaces(cfg: Config, registry: EnvRegistry, seed: int) -> tuple[gym.Space, gym.Space, int]:
    """The env's (per-agent) spaces and its number of agents, from one instance made here (a vector env of one where
    --env_vectorization builds the splits of vector envs); with --check_env, that instance is first held to the env
    contract (envs/env_check.py): EnvContractError names the rule it broke."""
    served = services.probe_spaces(cfg, registry)
    if served is not None:
        return served
    backend = vector_backend(cfg, registry)
    if backend is not None:
        log.info("each split's %d envs are one vector env (--env_vectorization=%s: the %s backend)",
                 cfg.envs_per_split(), cfg.env_vectorization, backend.name)
    env = probe_env(cfg, registry, EnvContext(worker_index=-1, env_index=-1, seed=seed), backend)
    try:
        agents = num_agents(env)
        if is_multi_agent(env) and cfg.batched_sampling:
            raise ConfigError(f"env {cfg.env!r} is a multi-agent env ({agents} agents): it needs "
                              f"--batched_sampling=False (batched sampling steps single-agent envs only)")
        if cfg.check_env:  # this env is closed below: its reset and step change no env that trains
            for warning in check_env(env, cfg.env, seed, agents if is_multi_agent(env) else None, supported_spaces):
                log.warning("%s", warning)
        return env.observation_space, env.action_space, agents
    finally:
        env.close()


def supported_spaces(obs_space: gym.Space, action_space: gym.Space) -> None:
    """Raises ValueError for spaces the buffers and the model cannot hold (the env check reports it)."""
    obs_storage(obs_space)
    action_storage(action_space)


def initial_model(cfg: Config, obs_space: gym.Space, action_space: gym.Space, seed: int,
                  state: dict | None) -> ActorCritic:
    torch.manual_seed(seed)
    model = ActorCritic(obs_space, action_space, ModelSpec.from_config(cfg))
    for line in conv_summaries(model):  # built here first, so each conv encoder is reported once
        log.info("conv encoder for %s", line)
    if state is not None:
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise ValueError(f"the checkpoint does not fit the model these flags describe: {exc}") from None
    return model
