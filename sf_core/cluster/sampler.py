"""A sampler: the node-local pipeline (rollout workers, inference workers, batcher, trajectory buffers in shared
memory) inside one Ray actor, emitting shards for the driver's learner instead of training.

`Sampler` is a plain class; sf_core/cluster/placement.py makes it a Ray actor (threaded: a `next_shard` call
waits on the outbox while `set_weights` runs beside it). `SamplerHost` plays the runner's part on the node:
it owns the event loop (on a thread of the actor), collects the components' reports for the next shard, and
turns a failed or silent component into an error that the driver's next call receives, so the driver
replaces the whole sampler (sf_core/cluster/ingest.py).
"""

from __future__ import annotations

import _multiprocessing
import contextlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing import resource_tracker

import gymnasium as gym
import numpy as np
import torch

from sf_core.envs.registry import EnvRegistry
from sf_core.cluster.shard_emitter import ShardEmitter, shard_emitter_name
from sf_core.cluster.shards import Shard, ShardMeta
from sf_core.common.logs import setup_logging
from sf_core.common.process_name import name_process
from sf_core.config import Config
from sf_core.contracts.component import Component, guarded
from sf_core.contracts.signals import SHARD_TAKEN, STOP, Report
from sf_core.machine.fit import refit_on_node
from sf_core.machine.start_method import start_method
from sf_core.machine.wiring import DatasetSink, Setup, Topology, build_components, check_user_code, initial_model
from sf_core.service.training import share_among_samplers
from signal_slot.signal_slot import EventLoop, Timer

log = logging.getLogger("sf_core")

CHECK_INTERVAL_SEC = 0.5
STOP_GRACE_SEC = 4.0


@dataclass
class SamplerSpec:
    """Everything a sampler is built from; each policy's weights travel beside it, as Ray objects."""

    cfg: Config
    registry: EnvRegistry
    obs_space: gym.Space
    action_space: gym.Space
    agents_per_env: int
    index: int
    incarnation: int
    seed: int
    niceness: int = 0  # the driver's: the sampler's processes are scheduled as the trainer's are on one machine
    count: int = 1  # samplers in the run: with --env_service each takes its share of the slots


class SamplerHost(Component):
    def __init__(self, cfg: Config):
        self.loop = EventLoop("sampler_loop", serial_mode=cfg.serial_mode)
        super().__init__(self.loop, "sampler")
        self.cfg = cfg
        self.reports: list[Report] = []
        self.lock = threading.Lock()
        self.error: str | None = None
        self.topology = Topology()
        self.lock_released = False  # the weights lock's name unlinked (see _unlink)

    def take_reports(self) -> list[Report]:
        with self.lock:
            reports, self.reports = self.reports, []
        return reports

    @guarded
    def on_report(self, report: Report) -> None:
        with self.lock:
            self.reports.append(report)

    @guarded
    def on_component_error(self, component: str, details: str) -> None:
        self.fail(f"{component} failed: {details.strip().splitlines()[-1] if details.strip() else 'unknown error'}")

    @guarded
    def check(self) -> None:
        heartbeats = self.topology.control.heartbeats if self.topology.control is not None else None
        if heartbeats is not None and heartbeats.all_started():
            self.release_lock_name()  # every process has it open: the name is no longer needed
        dead = self.topology.dead_components()
        if dead:
            self.fail(f"process of {dead[0].name} died")
        elif self.topology.control is not None and self.topology.control.heartbeats is not None:
            for name, silent, activity in self.topology.control.heartbeats.stalled(self.cfg.heartbeat_timeout):
                self.fail(f"{name}: no heartbeat for {silent:.0f}s (last activity: {activity})")
                break

    def release_lock_name(self) -> None:
        """Unlink the weights lock's name, once (a second unregister makes the resource tracker print a
        KeyError traceback)."""
        if not self.lock_released:
            for weights in self.topology.weights:
                _unlink(weights.lock)
            self.lock_released = True

    def fail(self, error: str) -> None:
        if self.error is None:
            self.error = error
            log.error("sampler: %s", error)
            self.shut_down()

    def shut_down(self) -> None:
        if self.topology.control is not None:
            self.topology.control.request_stop()
        STOP.emit(self)
        self.loop.stop()


class Sampler:
    """One node's sampling, as a Ray actor. Every method returns within its timeout."""

    def __init__(self, spec: SamplerSpec, versions: list[int], *weights: dict[str, np.ndarray]):
        """`weights`: each policy's, of `versions` (Ray passes them as separate arguments to fetch them)."""
        import ray

        setup_logging()  # the node's log lines reach the driver's console through Ray, prefixed with the actor
        self.spec, self.node = spec, ray.get_runtime_context().get_node_id()
        # a sampler never trains, writes no files
        cfg = replace(share_among_samplers(refit_on_node(spec.cfg), spec.count), ray_address="", num_learners=1,
                      mp_start_method=sampler_start_method(spec.cfg.mp_start_method))
        self.outbox: queue.Queue = queue.Queue(maxsize=cfg.shards_in_flight * cfg.num_policies)
        take_niceness(spec.niceness)  # before the processes start: they inherit it
        self.host = SamplerHost(cfg)
        if not cfg.serial_mode:
            check_user_code(cfg, spec.registry)
        models = [initial_model(cfg, spec.obs_space, spec.action_space, spec.seed, _state_dict(w)) for w in weights]
        setup = Setup(cfg, spec.registry, spec.obs_space, spec.action_space, models, list(versions), "cpu",
                      spec.seed, [""] * len(models), [None] * len(models), spec.agents_per_env,
                      (spec.index, spec.count))
        sink = DatasetSink(shard_emitter_name, lambda loop, datasets, control, p, n:
                           ShardEmitter(loop, datasets, self.outbox, control, p, n))
        self.host.topology = build_components(setup, self.host, sink)
        self.emitters = self.host.topology.learners
        self.weights = self.host.topology.weights
        timer = Timer(self.host.loop, CHECK_INTERVAL_SEC, object_id="sampler_check_timer")
        timer.timeout.connect(self.host.check)
        self.host.topology.start_processes()
        self.thread = threading.Thread(target=self._run, name="sampler_loop", daemon=True)
        self.thread.start()
        log.info("sampler %d (start %d) running on node %s", spec.index, spec.incarnation, self.node[:8])

    def _run(self) -> None:
        take_niceness(self.spec.niceness, quiet=True)  # the batcher and emitter's thread
        # Ray titles the actor's process by the call it runs (ray::Sampler.next_shard): the name goes on this
        # thread instead (sf:sampler3), where `ps -L`, `top -H` and scripts/chaos_soak.py find it
        name_process(f"sampler{self.spec.index}")
        try:
            self.host.loop.exec()
        except BaseException as exc:  # noqa: BLE001 - a slot raised in serial mode: the driver hears of it
            self.host.fail(f"{type(exc).__name__}: {exc}")

    def node_id(self) -> str:
        return self.node

    def next_shard(self, timeout: float, weights: dict[str, np.ndarray] | None = None, version: int = 0,
                   policy: int = 0) -> Shard | None:
        """The next shard, or None if none was ready within `timeout`; raises if the sampler failed. `weights`:
        policy `policy`'s of `version`, taken first, as `set_weights` would (one call instead of two)."""
        if weights is not None:
            self.set_weights(weights, version, policy)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.host.error is not None:
                raise RuntimeError(f"sampler {self.spec.index} on node {self.node[:8]}: {self.host.error}")
            try:
                policy, arrays = self.outbox.get(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                continue
            for emitter in self.emitters:  # the outbox is shared: whichever policy has a dataset waiting
                SHARD_TAKEN.emit(emitter)
            meta = ShardMeta(self.spec.index, self.spec.incarnation, self.node, self.host.take_reports(), policy)
            return Shard(meta, arrays)
        return None

    def set_weights(self, weights: dict[str, np.ndarray], version: int, policy: int = 0) -> int:
        """Policy `policy`'s learner's weights of `version`, into the node's shared weights (inference reads
        them there). Two calls may carry weights at once (a next_shard call and a set_weights call): the
        version is compared under the lock, so an older one never overwrites a newer one."""
        shared = self.weights[policy]
        with shared.lock:
            if version > shared.current_version():
                for name, tensor in shared.tensors.items():
                    np.copyto(tensor.numpy(), weights[name])
                shared.version[0] = version
        return version

    def stop(self) -> None:
        """Stop the components and their processes (the driver calls it before it ends the actor)."""
        if self.thread.is_alive():
            self.host.shut_down()
            self.thread.join(timeout=STOP_GRACE_SEC)
        self.host.topology.stop_processes(STOP_GRACE_SEC, self.host.cfg.heartbeat_timeout)
        self.host.release_lock_name()


def sampler_start_method(requested: str) -> str:
    """The machine's own rule (start_method.start_method), but no fork inside a Ray worker: it runs threads. Where
    that rule forks, a forkserver instead (a fresh process that imports torch once and forks every component
    from there), not spawn (which imports it in each)."""
    method = start_method(requested, "cpu")
    return "forkserver" if method == "fork" else method


def take_niceness(niceness: int, quiet: bool = False) -> None:
    """The calling thread (and the processes it starts) at `niceness`. Ray starts every worker at nice 15
    (RAY_worker_niceness) so that its own daemons stay responsive; for a sampler that is the node's whole
    workload, and on the driver's node it would lose every contest for a core to the learner, which one
    machine never makes it do. Lowering a nice value needs CAP_SYS_NICE (root, most often): without it the
    sampler runs at Ray's niceness, unless the nodes were started with RAY_worker_niceness=0."""
    current = os.getpriority(os.PRIO_PROCESS, 0)  # Linux: of this thread
    if current <= niceness:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except PermissionError:
        if not quiet:
            log.warning("sampler: running at nice %d, below the trainer's %d (no permission to raise it): start "
                        "the Ray nodes with RAY_worker_niceness=%d for full speed", current, niceness, niceness)


def _unlink(lock) -> None:
    """Under a forkserver or spawn, the weights lock is a named semaphore in /dev/shm that only
    multiprocessing's resource tracker unlinks at exit, and Ray kills the tracker with the actor. Its name is
    unlinked as soon as every process has opened it (SamplerHost.check), or else when the sampler stops (the
    driver waits for that, ingest.STOP_TIMEOUT_SEC, even for a sampler stopped while its processes were still
    starting)."""
    name = getattr(getattr(lock, "_semlock", None), "name", None)
    if name is None:  # serial mode, or a lock unlinked at creation
        return
    with contextlib.suppress(OSError):
        _multiprocessing.sem_unlink(name)
    with contextlib.suppress(Exception):  # noqa: BLE001 - no tracker in this process: nothing to forget
        resource_tracker.unregister(name, "semaphore")


def _state_dict(weights: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(np.array(array)) for name, array in weights.items()}
