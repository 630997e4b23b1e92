"""Remote steps at full speed: the `steps` message (several slots of a server, one reply per slot), a
batch of slots stepping at once, a rollout worker's splits stepping at once while one waits on a late
slot, and skip mode (the same pool and protocol in-process)."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest

from sf_core.envs.registry import EnvRegistry
from sf_core import register_env
from sf_core.service.batch_step import BatchStepper, StepResult
from sf_core.service.env_pool import EnvPool, SlotLost
from sf_core.service.pooled_env import PooledEnv
from sf_core.service.env_server import EnvServer
from sf_core.service.protocol import pack
from tests.helpers import train
from tests.service_envs import FlakyCartPole

SOLVED = 475.0


def _make_slow(name, cfg, ctx):
    # instances 0-2 take 0.1 s a step; instance 3 hangs far past the clients' timeout
    return FlakyCartPole(flaky=False, step_seconds=0.1 if ctx.env_index < 3 else 3.0)


def _make_flaky(name, cfg, ctx):
    return FlakyCartPole(flaky=ctx.env_index == 1)  # instance 1 raises at its third step


_flaky_builds: Counter = Counter()


def _make_flaky_once(name, cfg, ctx):
    """Instance 1 of a server raises at its third step, in its first incarnation only."""
    _flaky_builds[ctx.env_index] += 1
    return FlakyCartPole(flaky=ctx.env_index == 1 and _flaky_builds[ctx.env_index] == 1)


register_env("FlakyOnce-v0", _make_flaky_once)


def _replies(server: EnvServer, header: dict, arrays=()) -> list[dict]:
    return [json.loads(reply[0]) for reply in server.handle_all(pack(header, list(arrays)))]


def test_steps_message_gets_one_tagged_reply_per_slot_and_bad_ones_are_refused():
    server = EnvServer("Flaky-v0", 3, host=None, registry=EnvRegistry({"Flaky-v0": _make_flaky}))
    try:
        for slot in range(3):
            _replies(server, {"cmd": "reset", "slot": slot, "seed": slot})
        action = [np.array(0, np.int64)]
        replies = _replies(server, {"cmd": "steps", "id": 5, "slots": [2, 0], "autoreset": False}, action * 2)
        assert [(r["ok"], r["id"], r["slot"]) for r in replies] == [(True, 5, 2), (True, 5, 0)]
        assert all(len(r["arrays"]) == 1 for r in replies)

        for _ in range(3):  # instance 1's env raises at its third step: only its reply is an error
            replies = _replies(server, {"cmd": "steps", "id": 6, "slots": [0, 1], "autoreset": True}, action * 2)
        assert [(r["ok"], r["slot"]) for r in replies] == [(True, 0), (False, 1)]
        assert "simulated simulator crash" in replies[1]["error"]

        finished = None
        for n in range(600):  # autoreset: the reply that ends an episode carries the next one's start too
            reply = _replies(server, {"cmd": "steps", "id": 7 + n, "slots": [2], "autoreset": True}, action)[0]
            if reply["terminated"] or reply["truncated"]:
                finished = reply
                break
        assert finished is not None and len(finished["arrays"]) == 2 and "reset_info" in finished

        for header, arrays, message in (
                ({"cmd": "steps", "id": 1, "slots": [0, 0], "autoreset": False}, action * 2, "names a slot twice"),
                ({"cmd": "steps", "id": 1, "slots": [0, 2], "autoreset": False}, action, "sends 1 actions"),
                ({"cmd": "steps", "id": 1, "slots": [3], "autoreset": False}, action, "slot must be an integer"),
                ({"cmd": "steps", "id": "x", "slots": [0], "autoreset": False}, action, "integer id")):
            (reply,) = _replies(server, header, arrays)
            assert reply["ok"] is False and message in reply["error"], reply
    finally:
        server.close()


@pytest.fixture
def slow_server():
    """A --parallel=True server in this process: 4 instances, instance 3 hangs."""
    server = EnvServer("Slow-v0", 4, registry=EnvRegistry({"Slow-v0": _make_slow}), parallel=True)
    serving = threading.Thread(target=server.serve, daemon=True)
    serving.start()
    yield server
    server.stop()
    serving.join(timeout=5)
    server.close()


@pytest.mark.slow
def test_a_batch_of_slots_steps_at_once(slow_server):
    pool = EnvPool([(f"127.0.0.1:{slow_server.port}", i) for i in range(3)], "Slow-v0", timeout=1.0)
    stepper = BatchStepper(timeout=1.0)
    try:
        envs = [PooledEnv(pool, acquire_timeout=2.0) for _ in range(3)]
        for env in envs:
            env.reset(seed=0)
        started = time.monotonic()
        for _ in range(5):
            results = stepper.step(envs, [0, 1, 0], autoreset=True)
            assert all(isinstance(r, StepResult) and r.obs.shape == (4,) for r in results)
        assert time.monotonic() - started < 1.2, "3 slots × 5 steps of 0.1 s did not step at the same time"
    finally:
        stepper.close()
        pool.close()


@pytest.mark.slow
def test_a_late_slot_does_not_hold_back_the_workers_other_splits(slow_server):
    """Four splits of one env each, one on the hanging instance: the three others step (concurrently,
    in about one step time) while it waits; it gives up after --env_service_timeout, drops its
    trajectory and waits for a healthy slot, and its late reply is never mistaken for a new one."""
    from sf_core.cli.arguments import parse_args
    from sf_core.contracts.buffers import BufferLayout, TrajectoryBuffers
    from sf_core.contracts.sample import SampleSpaces
    from sf_core.contracts.signals import ENVS_STEPPED, REPORT
    from sf_core.sampling.rollout_worker import RolloutWorker
    from signal_slot.signal_slot import EventLoop

    cfg, _ = parse_args(["--env=Slow-v0", f"--env_service=127.0.0.1:{slow_server.port}*4", "--num_workers=1",
                         "--worker_num_splits=4", "--rollout=8", "--batch_size=32", "--serial_mode=True",
                         "--env_service_timeout=1.0", "--env_service_recheck_interval=0.5"])
    layout = BufferLayout.from_config(cfg)
    buffers = TrajectoryBuffers(layout, SampleSpaces(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                                                     gym.spaces.Discrete(2)))
    worker = RolloutWorker(EventLoop("test_loop", serial_mode=True), 0, cfg, EnvRegistry(), buffers, layout, 0)
    stepped, reports = queue.SimpleQueue(), []

    def emit(name, *args):
        if name == ENVS_STEPPED.name:
            stepped.put((args[0], time.monotonic()))
        elif name == REPORT.name:
            reports.append(args[0])

    worker.emit = emit
    try:
        worker.on_start()
        hung = next(s for s, r in enumerate(worker.runners) if r.envs[0].slot.index == 3)
        started = time.monotonic()
        for split in range(4):
            worker.advance(0, [split])
        arrivals = [stepped.get(timeout=5) for _ in range(4)]
        assert {s for s, _ in arrivals[:3]} == set(range(4)) - {hung} and arrivals[3][0] == hung
        assert max(t for _, t in arrivals[:3]) - started < 0.5, "the other splits waited for the late slot"
        assert 0.9 < arrivals[3][1] - started < 2.5
        for split, _ in arrivals:
            worker.envs_stepped(split)
        assert worker.parked == {hung: pytest.approx(time.time(), abs=5)}  # no healthy slot left for it
        worker.send_report()
        assert reports[-1].service.slot_faults == 1 and reports[-1].service.slot_counts["error"] == 1
        assert all(worker.runners[s].t == 1 for s in range(4) if s != hung)
        for split in set(range(4)) - {hung}:  # the healthy splits go on stepping
            worker.advance(0, [split])
            assert stepped.get(timeout=5)[0] == split
            worker.envs_stepped(split)
            assert worker.runners[split].t == 2
    finally:
        worker.stop()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_skip_mode_solves_cartpole_through_the_pool_and_protocol(tmp_path):
    # a higher learning rate and smaller datasets than the preset: solved in ~9 s here instead of ~23 s
    code, summary = train(tmp_path, "--env=CartPole-v1", "--env_service=skip:CartPole-v1", "--num_workers=2",
                          f"--target_mean_return={SOLVED}", "--train_for_seconds=150",
                          "--train_for_env_steps=10000000", "--learning_rate=0.001", "--batch_size=256")
    assert code == 0, summary.get("error")
    assert summary["time_to_target"] is not None and summary["mean_return_at_target"] >= SOLVED
    assert summary["slot_faults"] == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_skip_mode_heals_a_failing_env_as_a_service_would(tmp_path):
    """An env that raises on its (in-process) server: the slot fails, the trajectory is dropped, the
    slot is restored and re-admitted: the failure path of a real service, without one."""
    code, summary = train(tmp_path, "--env=FlakyOnce-v0", "--env_service=skip:FlakyOnce-v0",
                          "--num_workers=2", "--num_envs_per_worker=4", "--train_for_env_steps=6000",
                          "--env_service_recheck_interval=0.2", "--encoder_mlp_layers", "64", "64",
                          "--serial_mode=True")  # two workers in one process: each has its own instances
    assert code == 0, summary.get("error")
    assert summary["slot_faults"] == 1 and summary["slot_readmissions"] >= 1, summary
    assert summary["frames"] >= 6000


def test_each_owner_gets_its_own_in_process_server():
    from sf_core.service.remote_env import EnvClient, ServiceError
    from sf_core.service.skip import in_process_server, serve_in_process, stop_in_process

    a, b = serve_in_process("CartPole-v1", 2, owner="w0"), serve_in_process("CartPole-v1", 3, owner="w1")
    try:
        assert a != b and in_process_server(a) is not in_process_server(b)
        assert EnvClient(b).request({"cmd": "hello"})[0]["capacity"] == 3
    finally:
        stop_in_process(a)
        stop_in_process(b)
    with pytest.raises(ServiceError, match="no in-process server"):
        EnvClient(a).request({"cmd": "hello"})


def test_skip_mode_names_the_env_being_trained():
    from sf_core.cli.arguments import parse_args
    from sf_core.config import ConfigError

    for value, message in (("skip:Pendulum-v1", "serves 'Pendulum-v1', but --env=CartPole-v1"),
                           ("skip:", "skip mode takes one env name")):
        with pytest.raises(ConfigError, match=message):
            parse_args(["--env=CartPole-v1", f"--env_service={value}"])
