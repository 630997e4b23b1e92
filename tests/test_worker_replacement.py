"""A dead or hung rollout worker is replaced alone (--env_fault_policy=restart; sf_core/run/worker_replacement.py)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import re
import signal
import textwrap
import threading
import time
from queue import Empty

import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch

from sf_core.records import checkpoint
from tests import launch
from tests.helpers import read_summary, wait_for
from tests.test_faults import _queue_mutex

ENVS = textwrap.dedent('''
    import os
    import signal
    import sys
    import time

    import gymnasium as gym

    import sf_core.train
    from sf_core import register_env

    STEPS = 0  # env steps taken in this process


    class Fault(gym.Wrapper):
        """CartPole whose process meets `fault` at its 2000th step (at a reset after its 1000th, with `at_reset`);
        `once`: only the first process of the run that gets there. Inside the env, never inside a queue operation:
        an outside kill at a random moment may land in one, and rightly make every component restart."""

        def __init__(self, fault, ctx, marker, once=True, at_reset=False, gate=None):
            super().__init__(gym.make("CartPole-v1"))
            self.fault, self.ctx, self.marker, self.once, self.at_reset = fault, ctx, marker, once, at_reset
            self.gate = gate  # a file the test writes when it is ready for the fault (it read the pids before)

        def step(self, action):
            global STEPS
            STEPS += 1
            if STEPS >= 2000 and not self.at_reset and (self.gate is None or os.path.exists(self.gate)):
                self.meet()
            return self.env.step(action)

        def reset(self, **kwargs):
            if STEPS > 1000 and self.at_reset:
                self.meet()
            return self.env.reset(**kwargs)

        def meet(self):
            try:  # created or found in one call: two workers past the gate at once must not both meet it
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                if self.once:
                    return
            self.fault(self.ctx)


    def kill(ctx):
        os.kill(os.getpid(), signal.SIGKILL)


    def hang(ctx):
        os.kill(os.getpid(), signal.SIGSTOP)  # as an env step that never returns


    def segfault(ctx):
        os.kill(os.getpid(), signal.SIGSEGV)  # as a simulator's C library would


    def die_in_a_get(ctx):
        """Dies as if killed inside a get of its worker's signal queue, whose lock then stays taken."""
        import ctypes
        import gc

        from sf_core.sampling.rollout_worker import RolloutWorker
        from tests.test_faults import _queue_mutex

        # this process has every worker's object, as the runner built them: its own is the one of its index
        gc.unfreeze()  # the objects this process inherited are frozen (sf_core/common/forking.py): seen again
        worker = next(o for o in gc.get_objects() if isinstance(o, RolloutWorker) and o.worker == ctx.worker_index)
        queue = worker.event_loop.signal_queue
        for _ in range(10000):  # found while unlocked: an inference worker's put may hold it this instant
            try:
                mutex = ctypes.c_void_p(_queue_mutex(queue))
                break
            except AssertionError:
                time.sleep(0.0001)
        ctypes.CDLL(None).pthread_mutex_lock(mutex)
        kill(ctx)


    def take_the_runners_queue_lock(ctx):
        """As a put into the runner's signal queue (a report) does, and leaves it taken."""
        import ctypes
        import gc

        from sf_core.contracts.queue_lock import MUTEX
        from sf_core.sampling.rollout_worker import RolloutWorker

        gc.unfreeze()  # the objects this process inherited are frozen (sf_core/common/forking.py): seen again
        worker = next(o for o in gc.get_objects() if isinstance(o, RolloutWorker) and o.worker == ctx.worker_index)
        queue = worker.receiver_queues["runner"]
        ctypes.CDLL(None).pthread_mutex_lock(ctypes.c_void_p(ctypes.addressof(queue.queue_obj_buffer) + MUTEX))


    def die_in_a_put_to_the_runner(ctx):
        """Dies as if killed inside a put into the runner's signal queue, whose lock then stays taken."""
        take_the_runners_queue_lock(ctx)
        kill(ctx)


    def stop_in_a_put_to_the_runner(ctx):
        """Stops as if stopped (SIGSTOP, a debugger) inside that put: the lock stays taken by a live thread."""
        take_the_runners_queue_lock(ctx)
        hang(ctx)


    def slow_to_remake(cfg, ctx):
        """A worker's first env, made again in a replacement's process, takes a second (a simulator that loads a
        level)."""
        marker = os.path.join(cfg.train_dir, f"made_{ctx.worker_index}")
        if ctx.env_index == ctx.worker_index * cfg.num_envs_per_worker:
            if os.path.exists(marker):
                time.sleep(1.0)
            open(marker, "w").close()


    def make(name, cfg, ctx):
        marker = os.path.join(cfg.train_dir, "faulted")
        if name == "Killed-v0":
            slow_to_remake(cfg, ctx)
            return Fault(kill, ctx, marker, gate=os.path.join(cfg.train_dir, "go"))
        if name == "Hung-v0":
            return Fault(hang, ctx, marker)
        if name == "DyingInAGet-v0":
            return Fault(die_in_a_get, ctx, marker)
        if name == "DyingInAPutToTheRunner-v0":
            return Fault(die_in_a_put_to_the_runner, ctx, marker)
        if name == "StoppedInAPutToTheRunner-v0":
            return Fault(stop_in_a_put_to_the_runner, ctx, marker)
        return Fault(segfault, ctx, marker, once=False, at_reset=True)


    if __name__ == "__main__":
        for name in ("Killed-v0", "Hung-v0", "DyingInAGet-v0", "DyingInAPutToTheRunner-v0",
                     "StoppedInAPutToTheRunner-v0", "Segfaulting-v0"):
            register_env(name, make)
        sys.exit(sf_core.train.main(sys.argv[1:]))
''')
COMMON = ["--num_workers=2", "--env_fault_policy=restart", "--experiment_summaries_interval=0.2", "--report_interval=1",
          "--seed=3"]


def start(tmp_path, *args: str):
    script = tmp_path / "envs.py"
    script.write_text(ENVS)
    return launch.start([f"--train_dir={tmp_path}", "--experiment=r", *COMMON, *args], script=str(script),
                        cwd=str(tmp_path))


SEEN: dict[int, psutil.Process] = {}  # every process the trainer started, for the check that none outlives it


def watch(tmp_path, proc, until, timeout: float) -> list[int]:
    """The running summary's frame counter, read every 0.1 s until `until(summary)` or the trainer exits."""
    frames: list[int] = []
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        with contextlib.suppress(psutil.Error):
            SEEN.update((p.pid, p) for p in psutil.Process(proc.pid).children(recursive=True))
        summary = read_summary(tmp_path, "r")
        if summary:
            frames.append(summary["frames"])
            if until(summary):
                break
        time.sleep(0.1)
    return frames


def finish(proc, timeout: float) -> tuple[str, list[psutil.Process]]:
    """The trainer's output once it exited, and the processes it started that are still alive."""
    with contextlib.suppress(psutil.Error):
        SEEN.update((p.pid, p) for p in psutil.Process(proc.pid).children(recursive=True))
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    _, alive = psutil.wait_procs(list(SEEN.values()), timeout=10)
    SEEN.clear()
    return output, alive


def run_to_end(tmp_path, proc, timeout: float) -> tuple[str, dict]:
    """Watch the trainer until it exits; it must exit 0 and leave no process behind. Its output and summary."""
    watch(tmp_path, proc, lambda s: False, timeout)
    output, alive = finish(proc, 30)
    assert proc.returncode == 0, output[-3000:]
    assert not alive, f"processes outlived the trainer: {alive}"
    return output, read_summary(tmp_path, "r")


def killed_pid(fault: dict) -> int:
    return int(re.search(r"\(pid (\d+)\)", fault["cause"]).group(1))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_rollout_worker_is_replaced_alone_and_the_run_goes_on(tmp_path):
    # SIGKILL from a worker's 2000th step, once "go"; a time budget: a fast machine ends a small frame count first
    proc = start(tmp_path, "--env=Killed-v0", "--train_for_seconds=10")
    frames = watch(tmp_path, proc, lambda s: "pids" in s, 60)
    before = read_summary(tmp_path, "r")["pids"]
    (tmp_path / "go").touch()  # the env kills its process now that the pids before are known
    frames += watch(tmp_path, proc, lambda s: any(f["recovered_at"] for f in s.get("faults", [])), 60)
    during = read_summary(tmp_path, "r")
    frames += watch(tmp_path, proc, lambda s: False, 90)
    output, alive = finish(proc, 30)
    assert proc.returncode == 0, output[-3000:]
    assert not alive, f"processes outlived the trainer: {alive}"
    summary = read_summary(tmp_path, "r")
    assert frames == sorted(frames), "the frame counter went backwards"
    assert summary["frames"] > during["frames"], "the run did not go on after the replacement"
    assert summary["worker_replacements"] == 1 and summary["worker_restarts"] == 0, output[-3000:]
    fault = summary["faults"][0]
    dead = fault["component"]
    assert fault["action"] == "replaced" and "died with exit code -9" in fault["cause"]
    assert killed_pid(fault) == before[dead] and fault["recovered_at"] > fault["at"]
    # the replacement took a second to make its first env; the other worker went on producing meanwhile
    assert fault["frames_meanwhile"] > 0 and fault["recovery_seconds"] > 1.0
    # only the dead worker's process is new
    assert during["pids"][dead] != before[dead]
    assert {k: v for k, v in during["pids"].items() if k != dead} == {k: v for k, v in before.items() if k != dead}
    assert "replacing it alone" in output and f"{dead} serves again" in output
    assert "workers replaced: 1" in output  # the console's status line counts it


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stopped_rollout_worker_is_killed_after_the_heartbeat_timeout_and_replaced(tmp_path):
    # SIGSTOP at a worker's 2000th step: its env step never returns
    # a time budget, not a frame count: a fast machine reaches any small count before the timeout fires
    proc = start(tmp_path, "--env=Hung-v0", "--heartbeat_timeout=3", "--train_for_seconds=12")
    started = time.time()
    output, summary = run_to_end(tmp_path, proc, 100)
    assert summary["worker_replacements"] == 1, output[-3000:]
    fault = summary["faults"][0]
    recovered_at_frames = fault["frames"] + fault["frames_meanwhile"]
    assert summary["frames"] > recovered_at_frames, "the run did not go on after the replacement"
    assert fault["action"] == "replaced" and fault["recovered_at"] is not None
    assert f"(pid {killed_pid(fault)}) hung: no heartbeat for" in fault["cause"]
    assert "--heartbeat_timeout=3); its last activity: stepping envs" in fault["cause"]
    assert f"{fault['component']}: process {fault['component']}_proc (pid {killed_pid(fault)}) hung" in output
    assert time.time() - started < 60


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_that_dies_again_and_again_stops_the_run_with_a_checkpoint(tmp_path):
    # SIGSEGV at every reset after a process's 1000th step
    proc = start(tmp_path, "--env=Segfaulting-v0", "--max_worker_replacements=2", "--train_for_seconds=100")
    output, alive = finish(proc, 100)
    assert proc.returncode == 1, output[-3000:]
    assert not alive, f"processes outlived the trainer: {alive}"
    assert "died with exit code -11" in output
    assert "already replaced 2 times within 600s (--max_worker_replacements=2, --worker_replacement_window=600)" \
        in output.splitlines()[-1], output[-3000:]  # the last line says why the run stopped
    assert checkpoint.list_checkpoints(str(tmp_path / "r" / "checkpoint")), "no checkpoint saved on the way out"
    summary = read_summary(tmp_path, "r")
    assert summary["worker_replacements"] >= 2 and summary["faults"][-1]["action"] == "stopped the run"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_worker_that_died_holding_the_runners_queue_lock_is_replaced_once_the_lock_is_given_back(tmp_path):
    """The runner's loop waits for that lock; its watchdog gives it back for the dead holder (the soak's hang)."""
    proc = start(tmp_path, "--env=DyingInAPutToTheRunner-v0", "--train_for_env_steps=25000")
    output, summary = run_to_end(tmp_path, proc, 120)
    assert re.search(r"a dead process \(thread \d+\) left the runner's signal queue locked: given back", output), \
        output[-3000:]
    assert summary["frames"] >= 25000
    assert summary["worker_replacements"] == 1 and summary["worker_restarts"] == 0, summary["faults"]
    assert summary["faults"][0]["action"] == "replaced"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_stopped_holding_the_runners_queue_lock_is_killed_as_hung_and_replaced(tmp_path):
    """The runner's loop waits for that lock, so it cannot run its own check for hung components: its watchdog
    has the lock's holder killed once it held it for --heartbeat_timeout, then gives the lock back."""
    proc = start(tmp_path, "--env=StoppedInAPutToTheRunner-v0", "--heartbeat_timeout=3", "--train_for_seconds=12")
    started = time.time()
    output, summary = run_to_end(tmp_path, proc, 100)
    assert re.search(r"a dead process \(thread \d+\) left the runner's signal queue locked: given back", output), \
        output[-3000:]
    assert summary["worker_replacements"] == 1 and summary["worker_restarts"] == 0, summary["faults"]
    fault = summary["faults"][0]
    assert fault["action"] == "replaced" and fault["recovered_at"] is not None
    assert f"(pid {killed_pid(fault)}) hung: no heartbeat for" in fault["cause"]
    assert summary["frames"] > fault["frames"] + fault["frames_meanwhile"], "the run did not go on"
    assert time.time() - started < 60


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_worker_that_died_inside_a_queue_operation_makes_every_component_restart(tmp_path):
    """The queue it left locked would block whoever used it next: nothing of the old processes is kept."""
    proc = start(tmp_path, "--env=DyingInAGet-v0", "--train_for_env_steps=25000")
    output, summary = run_to_end(tmp_path, proc, 120)
    assert "restarting every component from a fresh checkpoint" in output
    assert summary["frames"] >= 25000
    assert summary["worker_restarts"] == 1 and summary["worker_replacements"] == 0
    fault = summary["faults"][0]
    assert fault["action"] == "restarted every component" and fault["recovered_at"] is not None
    assert f"the signal queue of {fault['component']} stays locked" in fault["cause"]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_component_stuck_where_its_watchdog_cannot_run_dies_with_a_killed_trainer(tmp_path):
    """A process blocked for good (on a queue a killed process left locked; here stopped) never runs its parent
    watchdog: the kernel's parent-death signal ends it when the trainer is killed."""
    proc = launch.start(["--env=CartPole-v1", "--num_workers=2", f"--train_dir={tmp_path}", "--experiment=r",
                         "--experiment_summaries_interval=0.2", "--train_for_seconds=60"])
    try:
        watch(tmp_path, proc, lambda s: s["frames"] > 0 and "pids" in s, 60)
        stuck = psutil.Process(read_summary(tmp_path, "r")["pids"]["rollout_worker_0"])
        stuck.suspend()
        proc.kill()
        proc.wait(timeout=10)
        gone, alive = psutil.wait_procs([stuck], timeout=10)
    finally:
        SEEN.clear()
        if proc.poll() is None:
            proc.kill()
    assert not alive, "a stopped component outlived the trainer killed with SIGKILL"


def test_locked_queues_names_the_receiver_behind_a_queue_a_dead_process_left_locked():
    from sf_core.contracts.component import Component, Routing
    from sf_core.contracts.signals import Signal
    from signal_slot.signal_slot import EventLoop

    def _ping(value: int) -> None:
        """A test signal."""

    class Receiver(Component):
        def got(self, value: int) -> None:
            pass

    ping = Signal("ping", _ping, "sender", "receiver")
    loops = [Routing.use_plain_pickle(EventLoop(f"probe_loop_{k}")) for k in range(3)]
    sender, locked, usable = Component(loops[0], "sender"), Receiver(loops[1], "locked"), Receiver(loops[2], "usable")
    ping.connect(sender, locked.got)
    ping.connect(sender, usable.got)
    loops[0].signal_queue.put_many([("stale", "advance", ())])  # for the dead process: stale
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    mutex = ctypes.c_void_p(_queue_mutex(loops[1].signal_queue))
    assert libc.pthread_mutex_trylock(mutex) == 0
    try:
        started = time.monotonic()
        assert Routing.locked_queues(sender, timeout=0.3) == ["locked"]
        assert time.monotonic() - started < 5.0
    finally:
        libc.pthread_mutex_unlock(mutex)  # the probe left waiting goes through now
    assert [m[1] for m in loops[2].signal_queue.get_many(timeout=1)] == ["queue_probe"]
    assert [m[1] for m in loops[0].signal_queue.get_many(timeout=1)] == ["queue_probe"]  # drained, then probed


def _wait_on(queue) -> None:
    queue.get_many(timeout=30)  # killed while waiting: what an idle rollout worker does most of the time


def _read_by_polling(queue, results) -> None:
    from sf_core.contracts.polling_queue import PollingQueue

    polling, got = PollingQueue(queue), 0
    while got < 200:
        got += len(polling.get_many(timeout=5))
    results.put(got)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_queue_whose_reader_died_waiting_on_it_serves_a_polling_reader():
    """glibc's process-shared condition variables are not robust: once a process killed while waiting on a
    queue's is counted there, a put waits for it to leave as soon as another process waits on it too, holding the
    queue's lock for good. A replacement reads its predecessor's queue by polling, so no put ever waits."""
    import faster_fifo

    ctx = multiprocessing.get_context("fork")
    queue, results = faster_fifo.Queue(100_000), ctx.SimpleQueue()
    dead = ctx.Process(target=_wait_on, args=(queue,))
    dead.start()
    time.sleep(0.5)
    dead.kill()
    dead.join()
    reader = ctx.Process(target=_read_by_polling, args=(queue, results), daemon=True)
    reader.start()
    time.sleep(0.2)
    done = threading.Event()

    def put() -> None:
        for k in range(200):
            queue.put(k, block=False)
            time.sleep(0.002)
        done.set()

    threading.Thread(target=put, daemon=True).start()
    try:
        assert done.wait(20), "a put blocked behind the dead waiter"
        reader.join(20)
        assert results.get() == 200
    finally:
        if reader.is_alive():
            reader.kill()
            reader.join()


def _replacement_worker(replaced: bool = True):
    """A rollout worker in its second incarnation (serial, on this thread) whose predecessor left every slot of
    its one split with a batcher (`replaced`; else the first, with every slot free); the signals it emits are
    recorded."""
    from signal_slot.signal_slot import EventLoop

    from sf_core.cli.arguments import parse_args
    from sf_core.contracts.buffers import BufferLayout, TrajectoryBuffers
    from sf_core.contracts.control import ControlBlock
    from sf_core.contracts.sample import SampleSpaces
    from sf_core.envs.registry import EnvRegistry
    from sf_core.sampling.rollout_worker import RolloutWorker

    cfg, _ = parse_args(["--env=CartPole-v1", "--num_workers=1", "--num_envs_per_worker=2", "--worker_num_splits=1",
                         "--rollout=4", "--batch_size=8", "--serial_mode=True", "--env_vectorization=none"])
    layout = BufferLayout.from_config(cfg)
    assert layout.sets_per_split >= 2
    buffers = TrajectoryBuffers(layout, SampleSpaces(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                                                     gym.spaces.Discrete(2)))
    control = ControlBlock(None, 1, 1)
    if replaced:
        assert control.next_incarnation(0) == 1
        for slot in range(layout.sets_per_split):
            buffers.holds.hold(0, slot)
    worker = RolloutWorker(EventLoop("replacement_loop", serial_mode=True), 0, cfg, EnvRegistry(), buffers, layout,
                           0, control)
    sent: list[tuple] = []
    worker.emit = lambda name, *args: sent.append((name, *args))
    return worker, buffers, sent


def test_a_replacement_worker_waits_for_the_slots_a_batcher_holds_and_ignores_stale_answers():
    worker, buffers, sent = _replacement_worker()
    try:
        worker.on_start()
        assert worker.unstarted == {0} and not [s for s in sent if s[0] == "policy_request_0"]
        worker.advance(0, [0])  # an answer to the dead predecessor's request (ticket of incarnation 0): not stepped
        worker.slots_freed([1])  # meant for the predecessor: the batcher still holds slot 1
        assert worker.unstarted == {0} and not [s for s in sent if s[0] == "policy_request_0"]
        buffers.holds.release(0, 1)  # the batcher copied it and let it go
        worker.slots_freed([1])
        worker.slots_freed([1])  # the same message again changes nothing
        requests = [s for s in sent if s[0] == "policy_request_0"]
        assert [(r[2], r[3], r[4]) for r in requests] == [(1, 1, 0)]  # ticket 1 (split 0, incarnation 1), slot 1
        assert list(worker.runners[0].free_sets) == [] and worker.held == set(range(worker.layout.sets_per_split)) - {1}
        worker.advance(0, [1])
        assert worker.runners[0].t == 1
        worker.send_report()
        assert {s[1].incarnation for s in sent if s[0] == "report"} == {1}
    finally:
        worker.stop()


def test_a_rollout_worker_sends_again_what_a_dead_inference_worker_did_not_answer():
    worker, _, sent = _replacement_worker(replaced=False)
    layout = worker.layout
    try:
        worker.on_start()
        [first] = [s for s in sent if s[0] == "policy_request_0"]
        assert first[2] == layout.ticket(0, 0, 0)
        assert worker.control.next_server_incarnation(0) == 1  # the runner, before the new process starts
        worker.resend_requests(0)  # the new process serves
        worker.resend_requests(0)  # once is enough: the request to it is not sent twice
        again = [s for s in sent if s[0] == "policy_request_0"][1:]
        assert [r[2] for r in again] == [layout.ticket(0, 0, 1)] and again[0][3:] == first[3:]  # the same row
        worker.advance(0, [first[2]])  # the dead process answered before it died: not stepped
        assert worker.runners[0].t == 0
        worker.advance(0, [again[0][2]])
        assert worker.runners[0].t == 1
        assert [s for s in sent if s[0] == "policy_request_0"][-1][2] == layout.ticket(0, 0, 1)  # the next, to it
    finally:
        worker.stop()


def _inference_worker(control):
    """An inference worker (serial, on this thread) of one rollout worker's one split; what it emits is recorded."""
    from signal_slot.signal_slot import EventLoop

    from sf_core.algo.model import ActorCritic, ModelSpec
    from sf_core.config import Config
    from sf_core.contracts.buffers import BufferLayout, NoLock, SharedWeights, TrajectoryBuffers
    from sf_core.contracts.sample import SampleSpaces
    from sf_core.sampling.inference_worker import InferenceWorker

    obs = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    cfg = Config(env="x", num_workers=1, num_envs_per_worker=2, worker_num_splits=1, rollout=4, batch_size=8,
                 serial_mode=True)
    layout, spec = BufferLayout.from_config(cfg), ModelSpec.from_config(cfg)
    model = ActorCritic(obs, gym.spaces.Discrete(2), spec)
    buffers = TrajectoryBuffers(layout, SampleSpaces(obs, gym.spaces.Discrete(2), model.rnn_state_size))
    worker = InferenceWorker(EventLoop("stale_inference_loop", serial_mode=True), 0, cfg, buffers,
                             SharedWeights(model, NoLock()), layout, obs, gym.spaces.Discrete(2), spec, "cpu", 0,
                             control)
    sent: list[tuple] = []
    worker.emit = lambda name, *args: sent.append((name, *args))
    buffers["policy_version"][:] = -7
    return worker, layout, buffers, sent


def test_an_inference_worker_drops_requests_of_a_replaced_incarnation():
    from sf_core.contracts.control import ControlBlock
    from sf_core.contracts.sample import RowOrigin

    control = ControlBlock(None, 1, 1)
    worker, layout, buffers, sent = _inference_worker(control)
    worker.on_start()
    assert not [s for s in sent if s[0] == "resend_requests_0"]
    control.next_incarnation(0)
    worker.policy_request(0, layout.ticket(0, 0), 0, 0, int(RowOrigin.AFTER_RESET), False)  # queued before
    worker.policy_request(0, layout.ticket(0, 1), 1, 0, int(RowOrigin.AFTER_RESET), False)
    worker.flush_requests()
    assert [s for s in sent if s[0] == "advance_0"] == [("advance_0", 0, [1])]
    assert torch.all(buffers["policy_version"][0, 0] == -7)  # the dead process's slot: untouched
    assert torch.all(buffers["policy_version"][1, 0] == 0)


def test_a_replacement_inference_worker_drops_requests_sent_to_its_predecessor_and_asks_for_them_again():
    from sf_core.contracts.control import ControlBlock
    from sf_core.contracts.sample import RowOrigin

    control = ControlBlock(None, 1, 1)
    control.next_server_incarnation(0)  # the runner, before the new process starts
    worker, layout, buffers, sent = _inference_worker(control)
    worker.on_start()
    assert sent == [("resend_requests_0", 0)]  # once its weights are loaded
    worker.policy_request(0, layout.ticket(0, 0, 0), 0, 0, int(RowOrigin.AFTER_RESET), False)  # sent to the dead one
    worker.policy_request(0, layout.ticket(0, 0, 1), 0, 0, int(RowOrigin.AFTER_RESET), False)  # sent again
    worker.flush_requests()
    assert [s for s in sent if s[0] == "advance_0"] == [("advance_0", 0, [layout.ticket(0, 0, 1)])]
    assert torch.all(buffers["policy_version"][0, 0] == 0)
    assert [s[1].incarnation for s in sent if s[0] == "report"] == [1]  # its first answers are reported at once
