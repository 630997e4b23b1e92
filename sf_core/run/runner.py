"""Runner: sets up an experiment, starts every component, watches it, checkpoints, and stops it.

Signals in: report, component_error (stop with its message), checkpoint_saved. Out: save_checkpoint
(periodically and at every stop), evaluate (sf_core/run/evaluations.py), stop (sf_core/contracts/signals.py).

The components themselves are built and connected by `sf_core.machine.wiring`.
"""

from __future__ import annotations

import logging
import os
import random
import signal as os_signal
import threading
import time
import traceback
from dataclasses import replace

import gymnasium as gym
import torch

from sf_core.algo.algorithms import check_values_source
from sf_core.algo.graph import build_graph
from sf_core.algo.params import LearningParams
from sf_core.algo.meshes import check_model_ranks
from sf_core.algo.placement import check_concurrency, check_placement
from sf_core.algo.registry import algorithm_builder, build_algorithm
from sf_core.envs.registry import EnvRegistry, registry_snapshot
from sf_core.config import Config, ConfigError
from sf_core.contracts.component import Component, ComponentError, Routing, guarded, reuse_freed_memory
from sf_core.contracts.loop_watchdog import start_loop_watchdog
from sf_core.contracts.sample import BATCH_KEYS
from sf_core.contracts.signals import EVALUATE, PBT_REPLACE, SAVE_CHECKPOINT, STOP, Report, Signal
from sf_core.learning.group.link import GroupError
from sf_core.machine.device import training_device
from sf_core.machine.wiring import Setup, Topology, build_components, check_user_code, initial_model, probe_spaces
from sf_core.records import wandb_logging
from sf_core.records.experiment import Experiment
from sf_core.run import emits
from sf_core.run.evaluations import Evaluations
from sf_core.run.run_records import closing_lines, error_lines, final_summary, start_stats
from sf_core.run.population import Population
from sf_core.run.progress import Progress
from sf_core.run.recovery import Recovery, died
from sf_core.run.stats import TrainingStats
from sf_core.run.stop_conditions import TARGET, already_finished, limits_reached, reached_line
from sf_core.service import training as services
from sf_core.run.worker_replacement import REPLACED, RESTART_ALL, WorkerReplacement
from signal_slot.signal_slot import EventLoop, Timer

log = logging.getLogger("sf_core")

EXIT_OK, EXIT_ERROR, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 130, 143
CHECK_INTERVAL_SEC = 0.25
SHUTDOWN_GRACE_SEC = 6.0
DEATH_REPORT_GRACE_SEC = 1.0
RANK_REPORT_GRACE_SEC = 3.0  # for the ingest (Ray) or the health check to name the dead rank a collective lost
EMIT_TIMEOUT_SEC = 2.0


class Runner(Component):
    def __init__(self, cfg: Config, registry: EnvRegistry | None = None, launched: float | None = None,
                 marks: dict[str, float] | None = None):
        self.launched = launched or time.time()  # train.main passes its own start: torch imports count
        self.seed = cfg.seed if cfg.seed >= 0 else random.randrange(2**31)
        self.cfg = replace(cfg, seed=self.seed)
        if cfg.with_wandb:  # before config.json is written: it keeps the run id
            self.cfg = wandb_logging.with_run_id(self.cfg, os.path.join(cfg.train_dir, cfg.experiment))
        self.registry = registry or registry_snapshot(only=(cfg.env, *services.envs_built_in_process(cfg)))
        # --ray_address: serial samplers if asked, never a serial driver (sf_core/cluster/driver.py says why)
        self.serial = cfg.serial_mode and not cfg.ray_address
        self.loop = EventLoop("runner_loop", serial_mode=self.serial)
        if not self.serial:
            Routing.use_plain_pickle(self.loop)
        super().__init__(self.loop, "runner")
        self.experiment = Experiment(self.cfg)
        self.topology = Topology()
        self._stats: TrainingStats | None = None  # made once the processes run (its writer has a thread)
        self.progress: Progress | None = None  # the console's bar, on a terminal (made with the stats)
        self.population = Population(self.cfg, self.experiment.path)  # each policy's checkpoints, PBT
        self.evaluations = Evaluations(self.cfg, self.population.dirs)  # --eval_every_env_steps; best.pt
        self.exit_code: int | None = None
        self.error: str | None = None
        self.dead_since: dict[str, float] = {}
        self.group_failure: tuple[str, str, float] | None = None  # a failed collective, waiting to be explained
        self.last_checkpoint: str | None = None
        self.stopping = self.restart_pending = False  # restart_pending: a worker died under --env_fault_policy=restart
        self.replacement = WorkerReplacement.for_run(self.cfg, self.serial)  # a dead or hung worker, replaced alone
        self.saved_at_shutdown = False
        self.recovery = Recovery(cfg.max_recoveries, cfg.env_frameskip, not (self.serial or cfg.ray_address))
        self.last_check = time.time()  # when check() last ran: the loop watchdog reads it
        self.loop_done = threading.Event()
        self.threads_before_fork = 0
        self.marks = dict(marks or {})  # start-up steps (wall clock): the caller's (train.main's), then ours

    @property
    def stats(self) -> TrainingStats:
        assert self._stats is not None, "stats exist once the components started"
        return self._stats

    # ---------------------------------------------------------------- setup
    def _build(self, resume: bool = False, start_method: str | None = None) -> None:
        cfg = self.cfg if start_method is None else replace(self.cfg, mp_start_method=start_method)
        if not self.serial:
            check_user_code(cfg, self.registry)
        # the algorithm's graph is checked here, so a broken one fails before any process starts
        algorithm = build_algorithm(algorithm_builder(cfg.algo), LearningParams.from_config(cfg))
        check_concurrency(cfg, build_graph(algorithm.nodes, BATCH_KEYS))
        check_placement(cfg, algorithm.nodes, algorithm.devices, algorithm.parts)
        check_model_ranks(cfg, algorithm.nodes)
        check_values_source(cfg, algorithm.nodes)
        obs_space, action_space, agents_per_env = probe_spaces(cfg, self.registry, self.seed)
        algorithm.check_spaces(obs_space, action_space)  # e.g. a teacher of another env: before any process
        self.marks.setdefault("env_probed", time.time())
        population = self.population
        population.check(agents_per_env)
        if resume:  # a restart inside the run (the first resume's were found by run)
            population.find_checkpoints()
        population.start_pbt(self.seed)
        states = population.states
        if self.population.resumed is not None:
            log.info("resuming from %s (policy v%d, %s env frames)", population.resume_from[0], states[0]["version"],
                     f"{self.population.resumed['frames']:,}")
        # a resumed run must not replay the env seeds of the first one
        seed = self.seed + (states[0]["version"] if states[0] else 0)
        if self.serial:  # every component's tensors are allocated in this process
            reuse_freed_memory()
        else:
            # the runner does little torch work itself; one thread keeps OpenMP's pool unstarted,
            # so forked component processes do not inherit a pool whose threads they lack
            self.threads_before_fork = torch.get_num_threads()
            torch.set_num_threads(1)
        models = [initial_model(cfg, obs_space, action_space, seed + 1_000_003 * p, state["model"] if state else None)
                  for p, state in enumerate(states)]
        device = training_device(cfg)
        versions = [state["version"] if state else 0 for state in states]
        setup = Setup(cfg, self.registry, obs_space, action_space, models, versions, device, seed, population.dirs,
                      population.resume_from, agents_per_env)
        if cfg.ray_address:  # the learner here, the samplers on the cluster's nodes
            from sf_core.cluster.driver import build_driver_components

            self.topology = build_driver_components(setup, self)
        else:
            self.topology = build_components(setup, self)
        self.marks.setdefault("components_built", time.time())  # buffers allocated, models made

    # ---------------------------------------------------------------- run
    def run(self) -> int:
        """Train until a stop condition; returns the process exit code."""
        try:  # first: a bad env, model or checkpoint fails before any file is written
            if self.cfg.restart_behavior == "resume":  # a rerun of a finished command stops here: nothing to do
                self.population.find_checkpoints()
                if (finished := already_finished(self.cfg, self.population, self.experiment.path)) is not None:
                    log.info("%s", finished)
                    return EXIT_OK
            self._build()
        except (ValueError, gym.error.Error) as exc:
            raise ConfigError(str(exc)) from exc
        Timer(self.loop, CHECK_INTERVAL_SEC, object_id="runner_check_timer").timeout.connect(self.check)

        previous = {sig: os_signal.signal(sig, self._on_os_signal) for sig in (os_signal.SIGINT, os_signal.SIGTERM)}
        try:
            self.experiment.prepare(resuming=self.population.resumed is not None)
            self._start_components()
            if not self.serial:
                kill_hung = lambda pid: self.replacement.kill_hung(self.topology, time.time(), self.recovery, pid)
                start_loop_watchdog(lambda: self.last_check, self.cfg.heartbeat_timeout + 30.0,
                                    lambda: self.topology.processes, self.loop_done, EXIT_ERROR,
                                    Routing.queue_of(self.loop), self.cfg.heartbeat_timeout, kill_hung)
            self.loop.exec()
            while self.restart_pending and self._restart_components():
                self.loop.exec()
        except Exception as exc:  # serial mode: a slot raised on this loop; any mode: the runner's own work
            self._fail(*((exc.component, exc.details) if isinstance(exc, ComponentError)
                         else ("runner", traceback.format_exc().rstrip())))
            self._stop_after_failure()
        finally:
            self.loop_done.set()
            self._stop_processes()
            for sig, handler in previous.items():
                os_signal.signal(sig, handler)
            self._close()
        for line in error_lines(self.error):
            log.error("%s", line)
        return self.exit_code if self.exit_code is not None else EXIT_OK

    def _start_components(self) -> None:
        self.topology.start_processes()
        self.marks.setdefault("processes_started", time.time())
        if self.threads_before_fork:  # this interpreter may train again, serially, later
            torch.set_num_threads(self.threads_before_fork)
        if self._stats is None:  # after the processes start (sf_core/run/run_records.py says why)
            self._stats = start_stats(self.cfg, self.experiment, self.population, self.launched, self.marks)
            self.progress = Progress(self.cfg, self.launched - self.stats.previous_seconds)  # over all sessions
        self.evaluations.start(self.stats)
        self.last_summary = self.last_console = self.last_save = time.time()

    def _restart_components(self) -> bool:
        """Every component restarts from the newest checkpoint, the path of a resume (nothing old reused). After a
        rollout worker's death, only from the one the shutdown saved; only a recovery rolls back."""
        self._stop_processes()
        self.restart_pending = False
        if self.error is not None or not (self.saved_at_shutdown or self.recovery.pending):
            self._fail("runner", "a rollout worker died and --env_fault_policy=restart could not restart: the "
                                 "learner did not save a checkpoint on the way down")
            return False  # its processes are closed with the run's end (_close)
        self.topology.close_processes()
        Routing.forget_all(self)  # connections to the old components
        Routing.drain(self.loop)  # reports or errors the old components sent while stopping
        Routing.rearm(self.loop)
        self.stopping = False
        self.dead_since, self.group_failure = {}, None
        self._build(resume=True, start_method="forkserver")  # this process now runs threads: fork a clean one
        self.recovery.restored(self.population.states, self.population.resume_from, self.stats)
        self._start_components()
        return True

    def _on_os_signal(self, signum, _frame) -> None:
        if self.exit_code is None:
            self.exit_code = EXIT_SIGINT if signum == os_signal.SIGINT else EXIT_SIGTERM
            log.warning("received %s: saving a checkpoint and stopping", os_signal.Signals(signum).name)

    # ---------------------------------------------------------------- slots
    @guarded
    def on_report(self, report: Report) -> None:
        if not self.evaluations.take(report, self.stats):  # an evaluation's result, else the run's statistics
            self.stats.add(report)
            self.recovery.saw(report, self.stats.frames)
            self.replacement.on_report(report, self.stats, self.topology, time.time())

    @guarded
    def on_component_error(self, component: str, details: str) -> None:
        rank = self.topology.dead_learner_rank()
        if rank is not None:  # a learner rank's death fails the learner's next collective: name the cause
            self._recover_or_fail(rank)
            return
        if details.startswith(GroupError.MARK) and self.group_failure is None:
            # a rank is gone: the ingest names it once Ray says which, or the health check sees it (check() waits)
            self.group_failure = (component, details, time.time())
            return
        self._fail(component, details)
        self._shutdown()

    @guarded
    def on_checkpoint_saved(self, path: str) -> None:
        self.last_checkpoint = path
        self.saved_at_shutdown = self.stopping
        self.evaluations.saved(path, lambda *evaluate: self._emit(EVALUATE, *evaluate))
        self.stats.checkpoints_saved += 1

    @guarded
    def check(self) -> None:
        cfg, stats, now = self.cfg, self.stats, time.time()
        self.last_check = now
        for r in self.population.pbt_step(stats):
            self._emit(PBT_REPLACE, r.source, r.hyperparams, route=r.policy)
        if now - self.last_summary >= cfg.experiment_summaries_interval:
            stats.write_summaries(self.population.pbt.scalars() if self.population.pbt else None)
            self.experiment.write_summary({**stats.summary(None, None, running=True), **self.recovery.summary(),
                                           "pids": self.topology.pids()})
            self.last_summary = now
        if self.progress is not None:
            self.progress.update(stats.frames, now)
        if now - self.last_console >= cfg.report_interval:
            log.info(stats.console_line())
            self.last_console = now
        if self.evaluations.due(stats.frames) or now - self.last_save >= cfg.save_every_sec:
            self._request_checkpoint()
            self.last_save = now
        self._check_health(now)
        if self.group_failure is not None and now - self.group_failure[2] > RANK_REPORT_GRACE_SEC:
            self._fail(*self.group_failure[:2])  # no rank was named: the collective's own error
            self._shutdown()
        if self.stopping:
            return
        reached = limits_reached(cfg, stats, stats.previous_seconds + now - self.launched)
        if self.exit_code is None and reached:
            log.info("%s", reached_line(cfg, reached[0]))
            if reached[0] == TARGET:
                stats.mark_target_reached(now)
            self.exit_code = EXIT_OK
        if self.exit_code is not None:
            self._shutdown()

    # ---------------------------------------------------------------- checks
    def _check_health(self, now: float) -> None:
        if self.error is not None or self.stopping:  # processes end while stopping: by design
            return
        for proc in self.topology.processes:
            if proc.is_alive():
                continue
            # a crashing component reports its error just before exiting: a moment for it (none if it was killed)
            first_seen = self.dead_since.setdefault(proc.name, now)
            if now - first_seen > DEATH_REPORT_GRACE_SEC or (proc.exitcode or 0) < 0:
                verdict = self.replacement.on_death(proc, died(proc), self.topology, self.stats, now,
                                                    self.exit_code is None)
                if verdict.action == REPLACED:
                    self.dead_since.pop(proc.name, None)
                    continue
                if verdict.action == RESTART_ALL:  # counted in stats.worker_restarts
                    self.restart_pending = True
                    self._shutdown()  # saves a checkpoint, stops the rest, ends this loop's exec
                else:
                    self._recover_or_fail(proc, verdict.message)
                return
        follow = self.recovery if self.exit_code is None else None  # stopping: nothing to recover for
        if (unfollowed := self.replacement.kill_hung(self.topology, now, follow)) is not None:
            self._fail(*unfollowed)

    def _recover_or_fail(self, proc, cause: str | None = None) -> None:
        """A learner, learner rank or inference worker killed is recovered from (sf_core/run/recovery.py), else stop.
        `cause`: the runner's line about the death, if not died(proc)'s."""
        process, hosted = proc.name, [c for c, p in self.topology.host.items() if p is proc]
        cause = self.recovery.cause_of(proc, cause or died(proc))
        if self.exit_code is None and self.recovery.handles(process, hosted, proc.exitcode):
            # a death while a recovery stops the rest (a rank after rank 0) is part of that recovery
            if self.restart_pending or self.recovery.begin(process, cause, self.dead_since.get(process, time.time()),
                                                                self.stats.faults, self.stats.frames):
                self.restart_pending, self.group_failure = True, None  # the failed collective is explained
                self._shutdown()  # the learners still alive save first; ends this loop's exec
                return
            cause = self.recovery.refusal(cause)
        self._fail(process, cause)
        self._shutdown()

    def _fail(self, component: str, details: str) -> None:
        if self.error is None:
            lines = details.strip().splitlines() or ["unknown error"]
            self.error = f"training stopped: {component} failed: {lines[-1]}"
            if len(lines) > 1:
                self.error += "\n" + details
            self.exit_code = EXIT_ERROR

    # ---------------------------------------------------------------- checkpoints and shutdown
    def _request_checkpoint(self) -> None:
        for p, (state, is_best) in enumerate(self.population.checkpoint_requests(self.stats)):
            self._emit(SAVE_CHECKPOINT, state, is_best, route=p)

    def _shutdown(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.saved_at_shutdown = False
        log.info(self.stats.console_line())
        if self.topology.control is not None:
            self.topology.control.request_stop()
        # never emit into the queue of a dead process: it may have died holding the queue's lock
        Routing.forget_receivers(self, [c.object_id for c in self.topology.dead_components()])
        self._request_checkpoint()  # queued before stop: the learner saves, then stops
        self._stop_processes(emits.emit(self, STOP, (), None, self.serial, EMIT_TIMEOUT_SEC))  # unreachable: no wait
        self.loop.stop()

    def _emit(self, signal_: Signal, *args, route: int | None = None) -> None:
        """`route`: the policy a routed signal is for. Never hangs on a dead process's queue (sf_core/run/emits.py)."""
        emits.emit(self, signal_, args, route, self.serial, EMIT_TIMEOUT_SEC)

    def _stop_after_failure(self) -> None:
        """Save and stop after an exception ended the loop (serial: it died with the slot; run it once more)."""
        if self._stats is None:  # nothing started that could save
            return
        if not self.serial:
            return self._shutdown()
        Routing.rearm(self.loop)
        self._request_checkpoint()
        STOP.emit(self)
        try:
            self.loop.process_events()
        except ComponentError:
            log.warning("could not save a checkpoint after the failure")

    def _stop_processes(self, unreachable: list[str] | None = None) -> None:
        self.topology.stop_processes(SHUTDOWN_GRACE_SEC, self.cfg.heartbeat_timeout, unreachable or [])

    def _close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self._stats is None:
            return
        self.evaluations.finish(self.topology.evaluator, self.stats, self.exit_code == EXIT_OK)
        self._closing("write the TensorBoard logs", self.stats.write_summaries)
        if self.stats.writer is not None:
            self._closing("close the TensorBoard logs", self.stats.writer.close)
        # from disk: in serial mode the learner's checkpoint_saved may still sit behind the loop's end
        last = self.population.last_checkpoints()
        self.last_checkpoint = last[self.stats.best_policy()]
        summary = {**final_summary(self.stats, last, self.exit_code, self.error), **self.recovery.summary()}
        self._closing("write training_summary.json", lambda: self.experiment.write_summary(summary))
        for line in closing_lines(self.stats, last, self.cfg.time_report):
            log.info(line)
        self.topology.close_processes()

    def _closing(self, what: str, step) -> None:
        """One step of the end: a failed write (a full disk) is said, and fails the run if nothing else did."""
        try:
            step()
        except OSError as exc:
            log.warning("could not %s: %s", what, exc)
            self._fail("runner", f"could not {what}: {exc}")
