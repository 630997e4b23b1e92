"""Calls to several services at once within one step (sf_core/service/concurrent_calls.py), and the pool's
least-loaded choice of slot (sf_core/service/slot_choice.py)."""

from __future__ import annotations

import statistics
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from sf_core.envs.registry import EnvRegistry
from sf_core.service.concurrent_calls import Services, step_at_once
from sf_core.service.env_pool import EnvPool, SlotLost
from sf_core.service.pooled_env import PooledEnv
from sf_core.service.env_server import EnvServer
from sf_core.service.service_set import PoolGroup, ServiceSet, ServiceSetEnv
from sf_core.service.skip import serve_in_process, stop_in_process
from sf_core.service.slot_choice import LeastUsed

STEP_SECONDS = 0.02
POOLS = ("driver", "sensors", "physics")


class Sleepy(gym.Env):
    """A simulator whose step sleeps (releasing the GIL, as a simulator elsewhere would) and returns values
    that depend on its seed, its steps and their actions; action 2 makes it raise."""

    observation_space = gym.spaces.Box(-1e9, 1e9, (3,), np.float64)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, step_seconds: float):
        self.step_seconds, self.state = step_seconds, np.zeros(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = np.array([float(seed or 0), 0.0, 0.0])
        return self.state.copy(), {}

    def step(self, action):
        time.sleep(self.step_seconds)
        if action == 2:
            raise RuntimeError("simulated simulator crash")
        self.state += [0.0, 1.0, float(action) + self.np_random.random()]
        return self.state.copy(), float(self.state[2]), False, False, {}


REGISTRY = EnvRegistry({"Sleepy-v0": lambda name, cfg, ctx: Sleepy(STEP_SECONDS),
                        "SlowSleepy-v0": lambda name, cfg, ctx: Sleepy(0.15)})


class Composed(gym.Env):
    """A step of three services, called in turn or at once; the action is one action per service."""

    def __init__(self, services: Services, at_once: bool):
        self.services, self.at_once = services, at_once
        self.observation_space = gym.spaces.Box(-1e9, 1e9, (9,), np.float64)
        self.action_space = gym.spaces.MultiDiscrete([3, 3, 3])

    def reset(self, *, seed=None, options=None):
        if self.at_once:
            out = self.services.reset(seed=seed)
        else:
            out = {name: env.reset(seed=seed) for name, env in self.services.items()}
        return np.concatenate([out[name][0] for name in POOLS]), {}

    def step(self, action):
        actions = dict(zip(POOLS, (int(a) for a in action)))
        if self.at_once:
            out = self.services.step(actions)
        else:
            out = {name: self.services[name].step(a) for name, a in actions.items()}
        return (np.concatenate([out[name][0] for name in POOLS]), sum(out[name][1] for name in POOLS),
                False, False, {})


@pytest.fixture(scope="module")
def servers():
    """One server per pool, each with one instance of a 20 ms simulator, listening on 127.0.0.1."""
    started = [EnvServer("Sleepy-v0", 1, registry=REGISTRY) for _ in POOLS]
    threads = [threading.Thread(target=server.serve, daemon=True) for server in started]
    for thread in threads:
        thread.start()
    yield {name: f"127.0.0.1:{server.port}" for name, server in zip(POOLS, started)}
    for server in started:
        server.stop()
    for thread, server in zip(threads, started):
        thread.join(timeout=5)
        server.close()


def _composed(servers: dict[str, str], at_once: bool) -> tuple[ServiceSetEnv, PoolGroup]:
    group = PoolGroup({name: EnvPool([(address, 0)], None, timeout=2.0, recheck_interval=0.05)
                       for name, address in servers.items()})
    services = ServiceSet(group)
    return ServiceSetEnv(Composed(services.envs, at_once), services, acquire_timeout=2.0), group


def _episode(env: gym.Env, actions: list) -> tuple[list, list[float]]:
    """Observations and step times of an episode seeded 7 with `actions`."""
    observations = [env.reset(seed=7)[0]]
    seconds = []
    for action in actions:
        started = time.perf_counter()
        observations.append(env.step(action)[0])
        seconds.append(time.perf_counter() - started)
    return observations, seconds


def test_a_step_at_once_costs_the_slowest_call_and_returns_what_calls_in_turn_return(servers):
    actions = [(0, 1, 1), (1, 0, 1), (1, 1, 0)]
    results = {}
    for at_once in (False, True):
        env, group = _composed(servers, at_once)
        try:
            results[at_once] = _episode(env, actions)
            assert all(s.in_flight == 0 for pool in group.pools.values() for s in pool.slots)
        finally:
            env.close()
            group.close()
    (in_turn, in_turn_seconds), (at_once, at_once_seconds) = results[False], results[True]
    np.testing.assert_array_equal(np.array(at_once), np.array(in_turn))  # the servers' RNGs too: same seeds
    total = len(POOLS) * STEP_SECONDS  # what calling the three in turn costs at least
    assert min(in_turn_seconds) >= total
    assert statistics.median(at_once_seconds) < 0.7 * total, (at_once_seconds, in_turn_seconds)


def test_a_failing_call_at_once_fails_the_set_as_calls_in_turn_do(servers):
    """The sensors' simulator raises: the set lets go of every slot (that one out of service, the others
    restored and idle) and the step raises SlotLost, whichever way the calls were made."""
    outcomes = []
    for at_once in (False, True):
        env, group = _composed(servers, at_once)
        try:
            env.reset(seed=1)
            with pytest.raises(SlotLost, match=r"env slot 127\.0\.0\.1:\d+#0 failed: .*simulated simulator crash"):
                env.step((0, 2, 0))
            outcomes.append({name: pool.counts() for name, pool in group.pools.items()})
            assert not env.services.held()
            # the failed instance is restored by the health check and re-admitted
            deadline = time.monotonic() + 5.0
            while group.pools["sensors"].counts()["idle"] != 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert group.pools["sensors"].counts()["idle"] == 1
        finally:
            env.close()
            group.close()
    assert outcomes[0] == outcomes[1]
    assert outcomes[1]["sensors"]["error"] == 1
    assert outcomes[1]["driver"]["idle"] == 1 and outcomes[1]["physics"]["idle"] == 1


def test_calls_at_once_mix_served_and_local_envs():
    """An env that is not a served slot is called in turn; the results come back by name all the same."""
    address = serve_in_process("Sleepy-v0", 1, registry=REGISTRY, owner="mix")
    pool = EnvPool([(address, 0)], None)
    try:
        served, local = PooledEnv(pool, acquire_timeout=1.0), Sleepy(0.0)
        served.reset(seed=3)
        local.reset(seed=3)
        out = step_at_once({"served": served, "local": local}, {"served": 1, "local": 1})
        assert list(out) == ["served", "local"]
        np.testing.assert_array_equal(out["served"][0][:2], out["local"][0][:2])
    finally:
        pool.close()
        stop_in_process(address)


def _busy_server_pool(choice=None) -> tuple[EnvPool, PooledEnv, threading.Thread, str]:
    """Server A (2 slots) with a step in flight on A#0, server B (1 slot, used once before)."""
    a = serve_in_process("SlowSleepy-v0", 2, registry=REGISTRY, owner="a")
    b = serve_in_process("SlowSleepy-v0", 1, registry=REGISTRY, owner="b")
    pool = EnvPool([(a, 0), (a, 1), (b, 0)], None, choice=choice)
    pool.slots[2].uses = 1  # B#0 was used before: the least-used rule would pass it over
    first = PooledEnv(pool, acquire_timeout=1.0)
    first.reset(seed=0)
    assert first.slot is pool.slots[0]
    stepping = threading.Thread(target=first.step, args=(0,))
    stepping.start()
    deadline = time.monotonic() + 2.0
    while pool.slots[0].in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pool.slots[0].in_flight == 1
    return pool, first, stepping, b


@pytest.mark.parametrize("rule", ["least_loaded", "least_used"])
def test_least_loaded_picks_the_slot_of_the_idle_server(rule):
    pool, first, stepping, b = _busy_server_pool(LeastUsed() if rule == "least_used" else None)
    try:
        slot = pool.try_acquire()
        if rule == "least_loaded":  # server A has a step in flight, B none: B#0, though it was used more
            assert slot.name == f"{b}#0"
        else:  # the old rule: the least used, on the busy server
            assert slot is pool.slots[1]
    finally:
        stepping.join(timeout=5)
        pool.close()
        for address in {s.address for s in pool.slots}:
            stop_in_process(address)
