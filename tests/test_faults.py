"""Bad input and failures end with one clear message, a non-zero exit and no process left behind."""

import signal
import textwrap
import time
from queue import Empty

import psutil
import pytest

from tests import launch
from tests.helpers import train


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, message", [
    (["--env=NoSuchEnv-v0"], "unknown env 'NoSuchEnv-v0'"),
    (["--env=NoSuchEnv-v0"], "if it is your own env: pass --env_module=MODULE, a module that calls register_env"),
    (["--env=CartPole-v1", "--not_a_flag=3"], "unrecognized arguments: --not_a_flag=3"),
    (["--env=CartPole-v1", "--num_workers=0"], "--num_workers must be at least 1, got 0"),
    (["--env=CartPole-v1", "--learning_rate=fast"], "argument --learning_rate: invalid float value: 'fast'"),
    (["--env=CartPole-v1", "--num_envs_per_worker=7"], "must be divisible by --worker_num_splits=2"),
])
def test_bad_input_is_one_clear_error(tmp_path, args, message):
    started = time.time()
    result = launch.run(args + [f"--train_dir={tmp_path}"], timeout=50)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert time.time() - started < 30


@pytest.mark.slow
def test_help_lists_grouped_flags():
    result = launch.run(["--help"], timeout=50)
    assert result.returncode == 0
    for group in ("rollout:", "learning:", "model:", "env:", "logging:"):
        assert group in result.stdout
    assert "--worker_num_splits" in result.stdout


EXPLODING = textwrap.dedent('''
    import sys

    import gymnasium as gym

    import sf_core.train
    from sf_core import register_env


    class Exploding(gym.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self.steps = 0

        def step(self, action):
            self.steps += 1
            if self.steps == 200:
                raise RuntimeError("the simulator exploded at step 200")
            return self.env.step(action)


    def make(name, cfg, ctx):
        return Exploding(gym.make("CartPole-v1"))


    if __name__ == "__main__":
        register_env("Exploding-v0", make)
        sys.exit(sf_core.train.main(["--env=Exploding-v0"] + sys.argv[1:]))
''')


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["--serial_mode=True", "--serial_mode=False"])
def test_env_exception_stops_training_with_its_traceback(tmp_path, mode):
    script = tmp_path / "exploding.py"
    script.write_text(EXPLODING)
    started = time.time()
    result = launch.run([mode, "--num_workers=2", f"--train_dir={tmp_path}", "--train_for_seconds=60",
                         "--env_fault_policy=stop"],
                     timeout=80, script=str(script), cwd=str(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert "rollout_worker_" in output and "failed" in output
    assert "the simulator exploded at step 200" in output
    assert "Exploding-v0" in output
    assert time.time() - started < 40


NAN_ENV = textwrap.dedent('''
    import sys

    import gymnasium as gym
    import numpy as np

    import sf_core.train
    from sf_core import register_env


    class NaNReward(gym.Wrapper):
        def step(self, action):
            obs, reward, term, trunc, info = self.env.step(action)
            return obs, float("nan"), term, trunc, info


    def make(name, cfg, ctx):
        return NaNReward(gym.make("CartPole-v1"))


    if __name__ == "__main__":
        register_env("NaNReward-v0", make)
        sys.exit(sf_core.train.main(["--env=NaNReward-v0", "--num_workers=1"] + sys.argv[1:]))
''')


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_nan_reward_is_named_not_trained_on(tmp_path):
    script = tmp_path / "nan_env.py"
    script.write_text(NAN_ENV)
    result = launch.run([f"--train_dir={tmp_path}", "--train_for_seconds=60"], timeout=80, script=str(script),
                     cwd=str(tmp_path))
    assert result.returncode == 1
    assert "non-finite observation or reward" in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_stops_every_process(tmp_path, sig, code):
    proc = launch.start(["--env=CartPole-v1", "--num_workers=2", f"--train_dir={tmp_path}", "--train_for_seconds=120"])
    try:
        deadline = time.time() + 30
        children = []
        while time.time() < deadline:  # wait until training is really running
            children = psutil.Process(proc.pid).children(recursive=True)
            if (tmp_path / "default_experiment" / "config.json").exists() and len(children) >= 4:
                break
            time.sleep(0.2)
        time.sleep(1.0)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(sig)
        started = time.time()
        output, _ = proc.communicate(timeout=15)
        assert time.time() - started < 10
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, output[-2000:]
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"processes outlived the trainer: {alive}"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_killed_worker_process_is_reported(tmp_path):
    proc = launch.start(["--env=CartPole-v1", "--num_workers=2", f"--train_dir={tmp_path}", "--train_for_seconds=120",
                         "--env_fault_policy=stop"])
    try:
        deadline = time.time() + 30
        victim = None
        while time.time() < deadline and victim is None:
            time.sleep(0.5)
            names = {c.name(): c for c in psutil.Process(proc.pid).children()}  # the OS names of components
            if {"sf:inf0", "sf:rw0", "sf:rw1", "sf:learner"} <= set(names):
                victim = names["sf:rw0"]
        assert victim is not None, "training did not start its processes"
        time.sleep(2.0)
        victim.kill()
        output, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, output[-2000:]
    assert "rollout_worker_0_proc" in output and "died with exit code -9" in output
    assert "Traceback" not in output  # one clear message, and the shutdown path itself did not fail


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_trainings_in_one_interpreter_are_independent(tmp_path):
    import gymnasium as gym

    from sf_core.envs.registry import registry_snapshot
    from sf_core import register_env

    register_env("FirstRunOnly-v0", lambda name, cfg, ctx: gym.make("CartPole-v1"))
    # the second run's 2,000 frames end at its next report, a second's frames later (30k-60k here, serial)
    code1, first = train(tmp_path, "--env=FirstRunOnly-v0", "--serial_mode=True", "--seed=5",
                         "--train_for_env_steps=150000", experiment="one")
    code2, second = train(tmp_path, "--env=CartPole-v1", "--serial_mode=True", "--seed=5",
                          "--train_for_env_steps=2000", experiment="two")
    assert code1 == code2 == 0
    # the second run starts from a fresh model and fresh counters, not from where the first stopped
    assert second["frames"] < first["frames"]
    assert first["mean_return"] > 2 * second["mean_return"], (first["mean_return"], second["mean_return"])
    assert "FirstRunOnly-v0" in registry_snapshot().factories  # user registrations persist, by design


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sync_mode_with_a_dataset_that_splits_a_slot_keeps_training(tmp_path):
    """15 trajectories per dataset from slots of 8: one slot is always half-copied. Sync mode must
    still have room for a whole dataset, or workers and batcher wait on each other forever."""
    code, summary = train(tmp_path, "--env=CartPole-v1", "--serial_mode=True", "--async_rl=False",
                          "--num_workers=1", "--num_envs_per_worker=16", "--worker_num_splits=2", "--rollout=32",
                          "--batch_size=480", "--num_batches_per_epoch=1", "--train_for_seconds=6")
    assert code == 0
    assert summary["policy_version"] >= 10, summary
    # leftovers of a split slot wait for later datasets: lag bounded by the 2 slots each split owns here
    assert summary["final_learner_stats"]["policy_lag_max"] <= 2


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_all_samples_too_stale_is_not_a_nan(tmp_path):
    """--max_policy_lag=0 in async mode masks whole datasets; that must skip them, not poison the
    return normaliser with NaN."""
    code, summary = train(tmp_path, "--env=CartPole-v1", "--num_workers=2", "--max_policy_lag=0",
                          "--train_for_env_steps=60000")
    assert code == 0, summary.get("error")
    assert summary["policy_version"] > 3


def _queue_mutex(queue) -> int:
    """Address of a faster-fifo queue's pthread mutex inside its shared C++ Queue struct: the first
    8-aligned glibc pthread_mutex_t that is unlocked and process-shared (__kind, 16 bytes in, has
    the pshared bit 0x80), which the fields before it (sizes and counters) never look like."""
    import ctypes
    raw = bytes(queue.queue_obj_buffer)
    for offset in range(0, len(raw) - 40, 8):
        lock_owner_count = raw[offset:offset + 16]
        kind = int.from_bytes(raw[offset + 16:offset + 20], "little")
        if lock_owner_count == bytes(16) and kind == 0x80:
            return ctypes.addressof(queue.queue_obj_buffer) + offset
    raise AssertionError("no process-shared mutex found in the faster-fifo queue object")


@pytest.mark.timeout(30)
def test_emit_gives_up_on_a_queue_left_locked():
    # A process SIGKILLed inside a faster-fifo put keeps that queue's mutex locked forever (the CI
    # failure this guards against: the runner's "stop" hung behind a killed rollout worker). Here the
    # test holds the mutex itself, exactly what the dead process leaves behind.
    import ctypes
    import ctypes.util

    from sf_core.contracts.component import Component, Routing
    from sf_core.contracts.signals import Signal
    from signal_slot.signal_slot import EventLoop

    def _ping(value: int) -> None:
        """A test signal."""

    class Receiver(Component):
        def got(self, value: int) -> None:
            pass

    ping = Signal("ping", _ping, "sender", "receiver")
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    receiver_loop = Routing.use_plain_pickle(EventLoop("receiver_loop"))
    sender, receiver = Component(EventLoop("sender_loop"), "sender"), Receiver(receiver_loop, "receiver")
    ping.connect(sender, receiver.got)
    queue = receiver_loop.signal_queue
    mutex = ctypes.c_void_p(_queue_mutex(queue))
    assert libc.pthread_mutex_trylock(mutex) == 0, "the queue's mutex is not where the struct layout says"
    try:
        started = time.monotonic()
        assert Routing.emit_bounded(sender, ping, (1,), timeout=0.5) == ["receiver"]
        assert 0.4 < time.monotonic() - started < 5.0
    finally:
        libc.pthread_mutex_unlock(mutex)  # the abandoned put goes through now: no thread left stuck
    assert Routing.emit_bounded(sender, ping, (2,), timeout=5.0) == []  # an unlocked queue takes its message at once
    received = []
    deadline = time.monotonic() + 5
    while len(received) < 2 and time.monotonic() < deadline:
        try:
            received += [args[0] for _sender, _signal, args in queue.get_many(timeout=0.5)]
        except Empty:
            pass
    assert sorted(received) == [1, 2]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_stop_does_not_wait_for_a_process_whose_own_queue_was_left_locked():
    # What an inference worker killed inside a put leaves a rollout worker with: the worker's own queue locked,
    # so it waits inside its loop for good and cannot take the stop. The stop kills it once the others are
    # down, instead of waiting out its grace period (Topology.stop_processes). The test holds the mutex.
    import ctypes
    import ctypes.util
    import multiprocessing

    from sf_core.contracts.component import Component, ComponentProcess
    from sf_core.machine.wiring import Topology

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    proc = ComponentProcess("locked_proc", multiprocessing.get_context("fork"), 1)
    proc.reporter = Component(proc.event_loop, "locked")
    topology = Topology(components=[proc.reporter], processes=[proc], host={"locked": proc})
    mutex = ctypes.c_void_p(_queue_mutex(proc.event_loop.signal_queue))
    proc.start()
    held = False
    try:
        deadline = time.monotonic() + 10
        while not held and time.monotonic() < deadline:  # the process takes it for moments while it waits
            held = libc.pthread_mutex_trylock(mutex) == 0
        assert held
        time.sleep(0.5)  # the process's wait for signals has timed out: it waits for the mutex now
        started = time.monotonic()
        topology.stop_processes(grace=20.0, heartbeat_timeout=60.0, unreachable=["locked"])
        assert time.monotonic() - started < 5.0 and not proc.is_alive()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        if held:
            libc.pthread_mutex_unlock(mutex)
