"""Calls to several services at once, within one step of a composed env.

A composed env (sf_core/service/service_set.py) gets `ctx.services`, a `Services` mapping of pool name to
the env on its slot. Calling them in turn costs the sum of their latencies; `Services.step` sends every
request first, then waits for all the replies, so a step costs about the slowest call:

    class Driving(gym.Env):
        def __init__(self, services):
            self.services = services                              # ctx.services
        def step(self, action):
            out = self.services.step({"driver": action, "sensors": action, "physics": action})
            obs, reward, terminated, truncated, info = out["driver"]
            ...

A dict of requests in, a dict of replies (each what that env's `step` returns) out: the step stays plain
synchronous code, as gymnasium's is. Calls that depend on each other are successive dicts. Everything
runs on the calling thread (a rollout worker's split stepper): the requests go out on each slot's own
socket and one poll waits for the replies, with no event loop and no other thread, so nothing is shared
with the worker's other splits.

Failures are those of the same calls made in turn: every call is waited for (or times out), each slot
whose call failed is marked failed by its pool, and the first failure in the dict's order is raised
(`SlotLost` for a pooled slot), which makes a `ServiceSetEnv` let go of its whole set. An env that is not
a served slot (a local or wrapped env, a pooled env without a slot) is called in turn, after the served
requests are out; an in-process server (skip mode) answers as it is called.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import gymnasium as gym

from sf_core.service.pooled_env import PooledEnv
from sf_core.service.slot import Slot
from sf_core.service.remote_env import EnvClient, RemoteEnv, ServiceError, ServiceTimeout


class Services(dict):
    """A composed env's services by pool name (`ctx.services`), each a gymnasium.Env, with calls at once."""

    def step(self, actions: Mapping[str, Any]) -> dict[str, tuple]:
        """Step the named services at once: {name: action} -> {name: (obs, reward, terminated, truncated,
        info)}. A name that is not one of the services is a KeyError, before anything is sent."""
        return step_at_once({name: self[name] for name in actions}, actions)

    def reset(self, kwargs: Mapping[str, dict] | None = None, **common: Any) -> dict[str, tuple]:
        """Reset services at once: {name: reset kwargs} -> {name: (obs, info)}; without `kwargs`, every
        service with the same keyword arguments (`services.reset(seed=3)`)."""
        kwargs = kwargs if kwargs is not None else {name: common for name in self}
        return reset_at_once({name: self[name] for name in kwargs}, kwargs)


@dataclass
class _Call:
    env: gym.Env
    slot: Slot | None = None  # a pooled env's slot: its failure is the pool's to record
    remote: RemoteEnv | None = None  # where the request went; None: called in turn
    read: Callable | None = None  # the reply -> what the env's own call returns
    deadline: float = 0.0
    result: Any = None
    error: BaseException | None = None


def step_at_once(envs: Mapping[str, gym.Env], actions: Mapping[str, Any]) -> dict[str, tuple]:
    """`env.step(actions[name])` for every env of `envs`, at once (the module's docstring says how)."""
    return _at_once(envs, "step", lambda env, remote, name: (remote.step_request(actions[name]), remote.step_reply),
                    lambda env, name: env.step(actions[name]))


def reset_at_once(envs: Mapping[str, gym.Env], kwargs: Mapping[str, dict]) -> dict[str, tuple]:
    """`env.reset(**kwargs[name])` for every env of `envs`, at once."""
    def request(env: gym.Env, remote: RemoteEnv, name: str):
        unknown = set(kwargs[name]) - {"seed", "options"}
        if unknown:
            raise TypeError(f"reset() got unexpected keyword arguments {sorted(unknown)} for service {name!r}")
        seed = kwargs[name].get("seed")
        gym.Env.reset(env, seed=seed)  # the client's own RNG, as the env's own reset() seeds it
        return remote.reset_request(seed, kwargs[name].get("options")), remote.reset_reply

    return _at_once(envs, "reset", request, lambda env, name: env.reset(**kwargs[name]))


def _served(env: gym.Env) -> RemoteEnv | None:
    """The served instance behind `env` whose request can go out now, or None (called in turn)."""
    if isinstance(env, RemoteEnv):
        return env
    if isinstance(env, PooledEnv) and env.slot is not None:
        return env.pool._connect(env.slot)
    return None


def _at_once(envs: Mapping[str, gym.Env], what: str, request: Callable, in_turn: Callable) -> dict[str, Any]:
    calls = {name: _Call(env) for name, env in envs.items()}
    for name, call in calls.items():  # every request out first
        try:
            call.remote = _served(call.env)
            if call.remote is None:
                continue
            if isinstance(call.env, PooledEnv):
                call.env._check_suspect()
            (header, arrays), call.read = request(call.env, call.remote, name)
            call.deadline = time.monotonic() + call.remote.client.timeout
            call.remote.client.send(header, arrays)
            if isinstance(call.env, PooledEnv):  # its server's load (sf_core/service/slot_choice.py)
                call.slot = call.env.slot
                call.slot.in_flight += 1
        except Exception as exc:  # noqa: BLE001 - raised below, once the requests already out are answered
            call.remote, call.error = None, exc
    for name, call in calls.items():  # then the others, while the servers work
        if call.remote is None and call.error is None:
            try:
                call.result = in_turn(call.env, name)
            except Exception as exc:  # noqa: BLE001 - raised below, once the requests out are answered
                call.error = exc
    _wait(what, [call for call in calls.values() if call.remote is not None])
    return _outcome(calls)


def _wait(what: str, pending: list[_Call]) -> None:
    """Every call's reply read, or its failure recorded: by its deadline, never later."""
    while pending:
        ready = [call for call in pending if call.remote.client.answer is not None]  # in-process servers
        if not ready:
            import zmq  # with the sockets (sf_core/service/remote_env.py says why not before)

            poller = zmq.Poller()
            for call in pending:
                poller.register(call.remote.client.socket, zmq.POLLIN)
            wait = min(call.deadline for call in pending) - time.monotonic()
            events = dict(poller.poll(max(0, int(wait * 1000)) + 1))
            ready = [call for call in pending if call.remote.client.socket in events]
            now = time.monotonic()
            late = [call for call in pending if call not in ready and now >= call.deadline]
            for call in late:
                client: EnvClient = call.remote.client
                client.reset_socket()  # a REQ socket that missed its reply cannot send again
                call.error = ServiceTimeout(f"{client.address} did not answer {what!r} within {client.timeout:g}s")
                pending.remove(call)
        for call in ready:
            try:
                call.result = call.read(*call.remote.client.receive(0.0))
            except ServiceError as exc:
                call.error = exc
            except (KeyError, TypeError, ValueError) as exc:
                call.error = ServiceError(f"{call.remote.address} sent a malformed {what} reply: {exc!r}")
            pending.remove(call)


def _outcome(calls: dict[str, _Call]) -> dict[str, Any]:
    """The results by name; or, after a failure, each failed pooled slot marked failed and the first raised."""
    for call in calls.values():
        if call.slot is not None:
            call.slot.in_flight -= 1
    for call in calls.values():
        if isinstance(call.env, PooledEnv) and isinstance(call.error, ServiceError) and call.env.slot is not None:
            error, call.error = call.error, call.env._lose(call.error)  # out of service until re-admitted
            call.error.__cause__ = error
    failed = next((call.error for call in calls.values() if call.error is not None), None)
    if failed is not None:
        raise failed
    return {name: call.result for name, call in calls.items()}
