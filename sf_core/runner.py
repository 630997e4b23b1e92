"""Runner: sets up an experiment, starts every component, watches it, and stops it.

Signals in:  report(stats)                      from every component
             component_error(name, details)    a component failed: stop with its message
Signals out: stop()                             to every component

The same components run either all on this process's event loop (`--serial_mode=True`) or spread
over processes: one per rollout worker, one per inference worker, and one for the learner, whose
batcher runs on a thread beside it.
"""

from __future__ import annotations

import logging
import multiprocessing
import random
import signal as os_signal
import time
from dataclasses import replace

import torch

from algo.model import ActorCritic, ModelSpec
from envs.registry import EnvContext, EnvRegistry, registry_snapshot
from sf_core.batcher import Batcher
from sf_core.buffers import BufferLayout, DatasetBuffers, SharedWeights, TrajectoryBuffers, make_lock
from sf_core.component import Component, ComponentError, ComponentProcess, guarded
from sf_core.config import Config
from sf_core.experiment import Experiment
from sf_core.inference_worker import InferenceWorker
from sf_core.learner import Learner
from sf_core.rollout_worker import RolloutWorker
from sf_core.stats import TrainingStats
from signal_slot.signal_slot import EventLoop, Timer

log = logging.getLogger("sf_core")

EXIT_OK, EXIT_ERROR, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 130, 143
CHECK_INTERVAL_SEC = 0.25
SHUTDOWN_GRACE_SEC = 5.0


def resolve_device(requested: str) -> str:
    device = "cuda" if requested == "gpu" else requested
    if device.startswith("cuda") and not torch.cuda.is_available():
        log.warning("--device=%s requested but CUDA is not available here: using the CPU", requested)
        return "cpu"
    return device


class Runner(Component):
    def __init__(self, cfg: Config, registry: EnvRegistry | None = None):
        self.launched = time.time()
        self.seed = cfg.seed if cfg.seed >= 0 else random.randrange(2**31)
        self.cfg = replace(cfg, seed=self.seed)
        self.registry = registry or registry_snapshot()
        self.loop = EventLoop("runner_loop", serial_mode=cfg.serial_mode)
        super().__init__(self.loop, "runner")
        self.processes: list[ComponentProcess] = []
        self.components: list[Component] = []
        self.exit_code: int | None = None
        self.error: str | None = None
        self.dead_since: dict[str, float] = {}
        self.stats: TrainingStats | None = None
        self.experiment: Experiment | None = None
        self.stopping = False

    # ---------------------------------------------------------------- setup
    def _probe_spaces(self):
        env = self.registry.make(self.cfg.env, self.cfg, EnvContext(worker_index=-1, env_index=-1, seed=self.seed))
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()

    def _build(self) -> None:
        cfg = self.cfg
        if not cfg.serial_mode:
            self.registry.check_picklable()
        obs_space, action_space = self._probe_spaces()
        device = resolve_device(cfg.device)
        ctx = multiprocessing.get_context(cfg.mp_start_method)

        layout = BufferLayout.from_config(cfg)
        buffers = TrajectoryBuffers(layout, obs_space, action_space)
        datasets = DatasetBuffers(buffers, cfg.dataset_size() // cfg.rollout)
        torch.manual_seed(self.seed)
        model = ActorCritic(obs_space, action_space, ModelSpec.from_config(cfg))
        weights = SharedWeights(model, make_lock(cfg.serial_mode, ctx))
        log.info("model: %s parameters; buffers: %d trajectory slots of %d×%d steps",
                 f"{sum(p.numel() for p in model.parameters()):,}", layout.num_slots, layout.rollout + 1,
                 layout.envs_per_split)

        def host(name: str) -> tuple[EventLoop, ComponentProcess | None]:
            if cfg.serial_mode:
                return self.loop, None
            proc = ComponentProcess(name, ctx, cfg.torch_threads)
            self.processes.append(proc)
            return proc.event_loop, proc

        inference = []
        for i in range(cfg.policy_workers_per_policy):
            loop, proc = host(f"inference_worker_{i}_proc")
            inference.append(InferenceWorker(loop, i, cfg, buffers, weights, layout, obs_space, action_space,
                                             device, self.seed))
            if proc:
                proc.reporter = inference[-1]
        workers = []
        for w in range(cfg.num_workers):
            loop, proc = host(f"rollout_worker_{w}_proc")
            workers.append(RolloutWorker(loop, w, cfg, self.registry, buffers, layout, self.seed))
            if proc:
                proc.reporter = workers[-1]
        loop, proc = host("learner_proc")
        learner = Learner(loop, cfg, datasets, weights, obs_space, action_space, device, self.seed)
        batcher_loop = self.loop if cfg.serial_mode else EventLoop("batcher_loop")
        batcher = Batcher(batcher_loop, cfg, buffers, datasets, layout)
        if proc:
            proc.reporter = learner
            proc.threads.append((batcher_loop, batcher))

        self.components = [*inference, *workers, learner, batcher]
        self._connect(workers, inference, learner, batcher)

    def _connect(self, workers, inference, learner, batcher) -> None:
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
        for component in self.components:
            component.connect("report", self.on_report)
            component.connect("component_error", self.on_component_error)
            self.connect("stop", component.stop)

    # ---------------------------------------------------------------- run
    def run(self) -> int:
        """Train until a stop condition; returns the process exit code."""
        self._build()  # first: a bad env or model fails before any file is written
        self.experiment = Experiment(self.cfg)
        self.experiment.prepare()
        self.stats = TrainingStats(self.cfg.stats_window, self.experiment.summary_writer(), self.launched)
        timer = Timer(self.loop, CHECK_INTERVAL_SEC, object_id="runner_check_timer")
        timer.timeout.connect(self.check)
        self.last_summary = self.last_console = time.time()

        previous = {sig: os_signal.signal(sig, self._on_os_signal) for sig in (os_signal.SIGINT, os_signal.SIGTERM)}
        try:
            for proc in self.processes:
                proc.start()
            self.loop.exec()
        except ComponentError as exc:  # serial mode: a slot raised on this loop
            self._fail(exc.component, exc.details)
            self._stop_processes()
        except BaseException:
            self._stop_processes()
            raise
        finally:
            for sig, handler in previous.items():
                os_signal.signal(sig, handler)
            self._close()
        if self.error:
            log.error("%s", self.error)
        return self.exit_code if self.exit_code is not None else EXIT_OK

    def _on_os_signal(self, signum, _frame) -> None:
        if self.exit_code is None:
            self.exit_code = EXIT_SIGINT if signum == os_signal.SIGINT else EXIT_SIGTERM
            log.warning("received %s: stopping", os_signal.Signals(signum).name)

    @guarded
    def on_report(self, report: dict) -> None:
        self.stats.add(report)

    @guarded
    def on_component_error(self, component: str, details: str) -> None:
        self._fail(component, details)
        self._shutdown()

    def _fail(self, component: str, details: str) -> None:
        if self.error is None:
            headline = details.strip().splitlines()[-1] if details.strip() else "unknown error"
            self.error = f"training stopped: {component} failed: {headline}\n{details}"
            self.exit_code = EXIT_ERROR

    @guarded
    def check(self) -> None:
        cfg, stats, now = self.cfg, self.stats, time.time()
        if now - self.last_summary >= cfg.experiment_summaries_interval:
            stats.write_summaries()
            self.last_summary = now
        if now - self.last_console >= cfg.report_interval:
            log.info(stats.console_line())
            self.last_console = now
        self._check_processes(now)
        if self.exit_code is None:
            if stats.frames >= cfg.train_for_env_steps:
                log.info("reached --train_for_env_steps=%d", cfg.train_for_env_steps)
                self.exit_code = EXIT_OK
            elif stats.elapsed() >= cfg.train_for_seconds:
                log.info("reached --train_for_seconds=%g", cfg.train_for_seconds)
                self.exit_code = EXIT_OK
            elif len(stats.returns) >= cfg.stats_window and stats.mean_return() >= cfg.target_mean_return:
                log.info("reached --target_mean_return=%g", cfg.target_mean_return)
                stats.target_reached_at = now
                self.exit_code = EXIT_OK
        if self.exit_code is not None:
            self._shutdown()

    def _check_processes(self, now: float) -> None:
        for proc in self.processes:
            if proc.is_alive():
                continue
            # a crashing component reports its error just before exiting: give that report a moment
            first_seen = self.dead_since.setdefault(proc.name, now)
            if now - first_seen > 1.0 and self.error is None:
                self._fail(proc.name, f"process {proc.name} (pid {proc.pid}) died with exit code {proc.exitcode}")

    def _shutdown(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        log.info(self.stats.console_line())
        self.emit("stop")
        self._stop_processes()
        self.loop.stop()

    def _stop_processes(self) -> None:
        deadline = time.time() + SHUTDOWN_GRACE_SEC
        for proc in self.processes:
            proc.join(timeout=max(0.0, deadline - time.time()))
        for proc in self.processes:
            if proc.is_alive():
                log.warning("%s did not stop in %.0fs: terminating it", proc.name, SHUTDOWN_GRACE_SEC)
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)

    def _close(self) -> None:
        if self.stats is not None:
            self.stats.write_summaries()
            self.experiment.write_summary(self.stats.summary(self.exit_code, self.error))
            if self.stats.writer is not None:
                self.stats.writer.close()
        for proc in self.processes:
            try:
                proc.close()
            except ValueError:
                pass
