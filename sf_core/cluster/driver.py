"""The driver's components of a cluster run: each policy's learner as on one machine, and the shard ingest
in the place of the rollout and inference workers and the batchers (they run on the nodes, in samplers).
With --num_learners > 1 the learner is rank 0 of a group whose other ranks are Ray actors on the cluster's
nodes (sf_core/cluster/learner_ranks.py), which the ingest starts.

Each has a process, whatever --serial_mode says (it applies to the samplers): the ingest is Ray's driver,
and Ray ends a driver process that loses the cluster's head; the runner then stops the run, the learner
saving its checkpoint, as after any component's death.
"""

from __future__ import annotations

import os
from dataclasses import replace

from sf_core.algo.registry import algorithm_builder
from sf_core.cluster import placement
from sf_core.cluster.ingest import ShardIngest
from sf_core.cluster.learner_ranks import RemoteRanks
from sf_core.cluster.sampler import SamplerSpec
from sf_core.contracts import signals as sig
from sf_core.contracts.buffers import BufferLayout, DatasetBuffers, SharedWeights, make_lock
from sf_core.contracts.component import Component, ComponentProcess
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.sample import SampleSpaces
from sf_core.learning.group.link import plan_elsewhere
from sf_core.learning.learner import Learner, learner_name
from sf_core.machine.start_method import mp_context, start_method
from sf_core.machine.wiring import Setup, Topology, add_evaluator
from sf_core.sampling.periodic_evaluator import EVALUATOR

INGEST = "shard_ingest"


def build_driver_components(setup: Setup, runner: Component) -> Topology:
    """The driver's learners (one per policy) and ingest, each on a process of its own (the samplers get the
    flags as given, --serial_mode included)."""
    placement.check_reachable(setup.cfg)
    cfg = replace(setup.cfg, serial_mode=False)
    ctx = mp_context(start_method(cfg.mp_start_method, setup.device, cfg.most_torch_threads()))
    n = cfg.num_policies
    evaluator = [EVALUATOR] if cfg.eval_every_env_steps else []  # on this machine, beside the learners
    control = ControlBlock([*(learner_name(p, n) for p in range(n)), INGEST, *evaluator])
    topology = Topology(control=control)
    for model, version in zip(setup.models, setup.versions):
        topology.weights.append(SharedWeights(model, make_lock(cfg.serial_mode, ctx)))
        topology.weights[-1].version[0] = version
    layout = BufferLayout.from_config(cfg, setup.agents_per_env)
    spaces = SampleSpaces(setup.obs_space, setup.action_space, setup.models[0].rnn_state_size)
    datasets = [DatasetBuffers(spaces, layout.rollout, cfg.dataset_size() // cfg.rollout) for _ in range(n)]

    def loop_of(component: str, threads: int | None = None):
        proc = ComponentProcess(f"{component}_proc", ctx, threads or cfg.torch_threads)
        topology.processes.append(proc)
        topology.host[component] = proc
        return proc.event_loop, proc

    for p in range(n):
        topology.learners.append(_learner(setup, cfg, p, datasets[p], topology, control, loop_of))
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    spec = SamplerSpec(setup.cfg, setup.registry, setup.obs_space, setup.action_space, setup.agents_per_env, 0, 0,
                       setup.seed, niceness)
    learner = topology.learners[0]
    ranks = RemoteRanks(cfg, learner.group, learner.trainer, niceness) if learner.group is not None else None
    loop, ingest_proc = loop_of(INGEST)
    ingest = ShardIngest(loop, cfg, datasets, topology.weights, spec, control, ranks)
    ingest_proc.reporter = ingest
    ingest_proc.death_hint = (": it is this run's Ray driver, which Ray ends when the cluster's head (or this "
                              "machine's Ray node) is gone; Ray's own message is above")
    topology.components = [*topology.learners, ingest]
    if evaluator:
        add_evaluator(setup, topology, runner, *loop_of(EVALUATOR))
    sig.SHARDS_ARRIVED.connect(ingest, ingest.shards_arrived)
    for p, learner in enumerate(topology.learners):
        sig.BATCH_READY.connect(ingest.ports[p], learner.batch_ready)
        sig.BATCH_CONSUMED.connect(learner, ingest.ports[p].batch_consumed)
        sig.CHECKPOINT_SAVED.connect(learner, runner.on_checkpoint_saved)
        sig.SAVE_CHECKPOINT.connect_to(runner, p, learner.save_checkpoint)
        sig.PBT_REPLACE.connect_to(runner, p, learner.pbt_replace)
    for component in topology.components:
        sig.REPORT.connect(component, runner.on_report)
        sig.COMPONENT_ERROR.connect(component, runner.on_component_error)
        sig.STOP.connect(runner, component.stop)
    return topology


def _learner(setup: Setup, cfg, p: int, datasets: DatasetBuffers, topology: Topology, control: ControlBlock,
             loop_of) -> Learner:
    """Policy p's learner on a process of its own; with --num_learners > 1, rank 0 of a group whose other ranks
    run on the cluster's nodes and meet it at this machine's address towards the head."""
    name = learner_name(p, cfg.num_policies)
    loop, proc = loop_of(name, cfg.learner_threads())
    group = (plan_elsewhere(cfg, setup.device, placement.driver_address(cfg), datasets[0])
             if cfg.num_learners > 1 else None)
    learner = Learner(loop, cfg, datasets, topology.weights[p], setup.obs_space, setup.action_space,
                      setup.models[p].spec, setup.device, setup.seed + 1_000_003 * p, setup.checkpoint_dirs[p],
                      setup.resume_from[p], algorithm_builder(cfg.algo), control, p, topology.weights, group)
    proc.reporter = learner
    return learner
