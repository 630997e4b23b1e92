"""A gymnasium.Env whose instance lives in an env server (sf_core/env_server.py).

    env = RemoteEnv("127.0.0.1:5555", slot=0)   # instance 0 of that server
    obs, info = env.reset(seed=1)

Every request waits at most `timeout` seconds: a server that died or hangs raises ServiceTimeout, never
blocks forever. After a timeout the socket is thrown away (a ZeroMQ REQ socket that missed its reply
cannot send again) and the next request opens a new one, which also reaches a restarted server.

pyzmq is imported with the first socket, not with this module, which every run imports (the rollout workers'
code names its classes): a run without env services would spend 0.01-0.02 s of its start-up loading ZeroMQ.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from sf_core.service.protocol import (
    PROTOCOL_VERSION,
    ProtocolError,
    ServiceError,
    leaf_spaces,
    max_message_bytes,
    obs_value,
    pack,
    space_array,
    space_from_json,
    unpack,
)
from sf_core.service.skip import in_process_server, is_skip

if TYPE_CHECKING:
    import zmq

_contexts: dict[int, zmq.Context] = {}
_contexts_lock = threading.Lock()


def zmq_context() -> zmq.Context:
    """One context per process: a forked worker must not use its parent's (its I/O threads are not there)."""
    import zmq

    pid = os.getpid()
    with _contexts_lock:
        if pid not in _contexts:
            _contexts.clear()  # a parent's context, inherited over fork: never touched here
            _contexts[pid] = zmq.Context()
        return _contexts[pid]


def close_context() -> None:
    """Terminate this process's context (its sockets must be closed): the runner does it before forking."""
    with _contexts_lock:
        context = _contexts.pop(os.getpid(), None)
    if context is not None:
        context.term()


class ServiceTimeout(ServiceError):
    """No answer within the timeout: the server is down, hung or unreachable."""


class EnvClient:
    """Requests to one server address over a REQ socket, each with a timeout."""

    def __init__(self, address: str, timeout: float = 5.0, max_bytes: int = 64 << 20):
        self.address, self.timeout, self.max_bytes = address, timeout, max_bytes
        self.socket: zmq.Socket | None = None
        self.pending_cmd: str | None = None  # what the request out is, for a timeout's message
        self.answer: list | None = None  # an in-process server's answer (skip mode), until `receive`

    def _socket(self) -> zmq.Socket:
        import zmq

        if self.socket is None:
            self.socket = zmq_context().socket(zmq.REQ)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.setsockopt(zmq.MAXMSGSIZE, self.max_bytes)
            self.socket.connect(f"tcp://{self.address}")
        return self.socket

    def request(self, header: dict, arrays: list[np.ndarray] = (), timeout: float | None = None
                ) -> tuple[dict, list[np.ndarray]]:
        """Send one request and wait for its reply; ServiceError (ServiceTimeout) on failure."""
        self.send(header, arrays)
        return self.receive(timeout)

    def send(self, header: dict, arrays: list[np.ndarray] = ()) -> None:
        """The first half of `request`: the request goes out, and `receive` waits for its answer. Several
        clients' requests can so be out at once (sf_core/service/concurrent_calls.py)."""
        self.pending_cmd = header.get("cmd")
        if is_skip(self.address):  # an in-process server: the same messages, handed over without a socket
            self.answer = in_process_server(self.address).handle(pack(header, arrays))
            return
        import zmq

        try:  # a REQ socket queues the request even before it connects: NOBLOCK fails only on a full pipe
            self._socket().send_multipart(pack(header, arrays), flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.reset_socket()
            raise ServiceError(f"{self.address}: {exc}") from None

    def receive(self, timeout: float | None = None) -> tuple[dict, list[np.ndarray]]:
        """The answer to the request `send` sent, within `timeout` (default: the client's) of now."""
        if self.answer is not None:
            frames, self.answer = self.answer, None
            return check_reply(self.address, frames, self.max_bytes)
        import zmq

        timeout_ms = int(1000 * (self.timeout if timeout is None else timeout))
        try:
            if self.socket is None or not self.socket.poll(timeout_ms, zmq.POLLIN):
                raise zmq.Again()
            frames = self.socket.recv_multipart()  # copying is cheaper than zero-copy frames for small messages
        except zmq.ZMQError as exc:
            self.reset_socket()
            if isinstance(exc, zmq.Again):
                raise ServiceTimeout(f"{self.address} did not answer {self.pending_cmd!r} within "
                                     f"{timeout_ms / 1000:g}s") from None
            raise ServiceError(f"{self.address}: {exc}") from None
        return check_reply(self.address, frames, self.max_bytes)

    def reset_socket(self) -> None:
        if self.socket is not None:
            self.socket.close(0)
            self.socket = None

    def close(self) -> None:
        self.reset_socket()


def check_reply(address: str, frames: list, max_bytes: int) -> tuple[dict, list[np.ndarray]]:
    """A reply's (header, arrays); ServiceError if it is malformed or an error answer."""
    try:
        reply, out = unpack(frames, max_bytes)
    except ProtocolError as exc:
        raise ServiceError(f"{address} sent a malformed reply: {exc}") from None
    if reply.get("ok") is not True:
        raise ServiceError(f"{address}: {reply.get('error', 'error without a message')}")
    return reply, out


class ServerChannel:
    """A DEALER socket to one server for `steps` requests: one message for several slots, and their
    replies as they come, one per slot. Owned by one thread (a split's stepper)."""

    def __init__(self, address: str, max_bytes: int):
        self.address, self.max_bytes = address, max_bytes
        self.socket: zmq.Socket | None = None
        self.replies: deque[list] = deque()  # an in-process server's answers (skip mode)

    def send(self, header: dict, arrays: list[np.ndarray]) -> None:
        if is_skip(self.address):
            self.replies.extend(in_process_server(self.address).handle_all(pack(header, arrays)))
            return
        import zmq

        if self.socket is None:
            self.socket = zmq_context().socket(zmq.DEALER)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.setsockopt(zmq.MAXMSGSIZE, self.max_bytes)
            self.socket.connect(f"tcp://{self.address}")
        try:  # the empty frame makes the envelope a REQ socket's, which the server expects
            self.socket.send_multipart([b"", *pack(header, arrays)], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.reset_socket()
            raise ServiceError(f"{self.address}: {exc}") from None

    def receive(self, timeout: float) -> tuple[dict, list[np.ndarray]] | None:
        """The next reply, as (header, arrays) without checking `ok`; None if none came within `timeout`."""
        if self.replies:
            frames = self.replies.popleft()
        else:
            import zmq

            if self.socket is None or not self.socket.poll(max(0, int(timeout * 1000)), zmq.POLLIN):
                return None
            frames = self.socket.recv_multipart()[1:]
        try:
            return unpack(frames, self.max_bytes)
        except ProtocolError as exc:
            return {"ok": False, "error": f"{self.address} sent a malformed reply: {exc}"}, []

    def reset_socket(self) -> None:
        """Forget the connection (after a timeout): late replies to the old socket are never read."""
        self.replies.clear()
        if self.socket is not None:
            self.socket.close(0)
            self.socket = None


def hello(client: EnvClient, timeout: float | None = None) -> dict:
    """The server's description: env name, capacity, spaces (JSON)."""
    reply, _ = client.request({"cmd": "hello"}, timeout=timeout)
    if reply.get("protocol") != PROTOCOL_VERSION:
        raise ServiceError(f"{client.address} speaks protocol {reply.get('protocol')}, this client {PROTOCOL_VERSION}")
    return reply


class RemoteEnv(gym.Env):
    """Instance `slot` of the server at `address`, as a gymnasium.Env."""

    metadata = {"render_modes": []}

    def __init__(self, address: str, slot: int = 0, timeout: float = 5.0, description: dict | None = None):
        self.address, self.slot = address, slot
        self.client = EnvClient(address, timeout)
        try:
            self.description = description or hello(self.client)
            self.observation_space = space_from_json(self.description["observation_space"])
            self.action_space = space_from_json(self.description["action_space"])
        except (ProtocolError, KeyError) as exc:
            self.client.close()
            raise ServiceError(f"{address} described its env badly: {exc}") from None
        except ServiceError:
            self.client.close()
            raise
        if not 0 <= slot < int(self.description["capacity"]):
            self.client.close()
            raise ServiceError(f"{address} has {self.description['capacity']} slots; there is no slot {slot}")
        self.client.max_bytes = max_message_bytes(self.observation_space, self.action_space)

    def _obs(self, arrays: list[np.ndarray]) -> Any:
        leaves = leaf_spaces(self.observation_space)
        if len(arrays) != len(leaves):
            raise ServiceError(f"{self.address} sent {len(arrays)} observation arrays, expected {len(leaves)}")
        return obs_value(self.observation_space, [self._leaf(space, obs) for space, obs in zip(leaves, arrays)])

    def _leaf(self, space: gym.Space, obs: np.ndarray) -> np.ndarray | int:
        if isinstance(space, gym.spaces.Discrete):
            if obs.shape != () or obs.dtype.kind not in "iu":
                raise ServiceError(f"{self.address} sent a {obs.dtype}{list(obs.shape)} observation for {space}")
            return int(obs)
        if obs.shape != space.shape or obs.dtype != space.dtype:
            raise ServiceError(f"{self.address} sent a {obs.dtype}{list(obs.shape)} observation, its space is "
                               f"{space.dtype}{list(space.shape)}")
        return obs.copy()  # writable, as a local env's observation would be (frombuffer gives a read-only view)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)  # the client's own RNG (gymnasium's contract); the env's is on the server
        return self.reset_reply(*self.client.request(*self.reset_request(seed, options)))

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return self.step_reply(*self.client.request(*self.step_request(action)))

    # each call as its request and the reading of its reply, so that calls to several servers can be out at once
    def reset_request(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, list]:
        return {"cmd": "reset", "slot": self.slot, "seed": seed, "options": options}, []

    def reset_reply(self, reply: dict, arrays: list[np.ndarray]) -> tuple[Any, dict]:
        return self._obs(arrays), reply.get("info", {})

    def step_request(self, action: Any) -> tuple[dict, list]:
        return {"cmd": "step", "slot": self.slot}, [space_array(self.action_space, action)]

    def step_reply(self, reply: dict, arrays: list[np.ndarray]) -> tuple[Any, float, bool, bool, dict]:
        return (self._obs(arrays), float(reply["reward"]), bool(reply["terminated"]), bool(reply["truncated"]),
                reply.get("info", {}))

    def restore(self, timeout: float | None = None) -> None:
        """Back to the instance's initial snapshot (a fresh instance if the env has no snapshots)."""
        self.client.request({"cmd": "restore", "slot": self.slot}, timeout=timeout)

    def ping(self, timeout: float | None = None) -> str:
        """This slot's health as the server sees it: "ok" or "broken"."""
        reply, _ = self.client.request({"cmd": "ping"}, timeout=timeout)
        return reply["slots"][self.slot]

    def close(self) -> None:
        self.client.close()
