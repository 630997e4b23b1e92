"""`python -m sf_core.env_server --env=NAME --port=P --capacity=C`: serve C instances of a registered env.

Clients (sf_core/service/remote_env.py) talk to it over ZeroMQ (a ROUTER socket here, REQ sockets there) with the
format in sf_core/service/protocol.py: a JSON header and raw array frames, never pickles. Every request names
an instance (its slot). A request that is malformed, truncated or too big is answered with an error and
the server carries on; an env that raises marks only its instance broken until a `restore` rebuilds it.

By default the server answers one request at a time: the least overhead for envs written in Python. With
--parallel=True each instance has its own thread, so instances step at the same time when the env
releases the GIL while it works (a C++ or GPU simulator, a subprocess, a VM over the network); the main
thread keeps receiving, validating and answering hello/ping meanwhile. For a Python env that needs
its own core, run one server per core instead and list them all in --env_service.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from typing import Any

import gymnasium as gym
import zmq

from envs.registry import EnvContext, EnvRegistry, registry_snapshot
from sf_core.config import Config
from sf_core.service.protocol import (
    COMMANDS,
    PROTOCOL_VERSION,
    ProtocolError,
    error_reply,
    is_structured,
    json_info,
    max_message_bytes,
    obs_arrays,
    pack,
    space_to_json,
    space_value,
    unpack,
)

log = logging.getLogger("sf_core.env_server")

POLL_MS = 200  # how often the loop looks at its stop flag
HARD_LIMIT_FACTOR = 4  # zmq drops (without an answer) only messages this many times over the limit


class EnvServer:
    """C env instances behind one ROUTER socket. `serve()` runs until `stop()` (or a signal)."""

    def __init__(self, env: str, capacity: int, host: str = "127.0.0.1", port: int = 0, seed: int = 0,
                 registry: EnvRegistry | None = None, cfg: Config | None = None, max_bytes: int | None = None,
                 parallel: bool = False):
        if capacity < 1:
            raise ValueError(f"--capacity must be at least 1, got {capacity}")
        self.env_name, self.capacity, self.seed = env, capacity, seed
        self.registry = registry or registry_snapshot()
        self.cfg = cfg or Config(env=env)
        self.instances: list[gym.Env | None] = [None] * capacity
        self.broken: list[str | None] = [None] * capacity  # why an instance is unusable until restored
        self.requests = 0
        for i in range(capacity):
            self.instances[i] = self._make(i)
        first = self.instances[0]
        self.observation_space, self.action_space = first.observation_space, first.action_space
        # fail at startup, not at the first client, if the spaces cannot travel
        if is_structured(self.action_space):
            raise ProtocolError(f"{type(self.action_space).__name__} action spaces cannot be served yet")
        self.spaces_json = {"observation_space": space_to_json(self.observation_space),
                            "action_space": space_to_json(self.action_space)}
        self.max_bytes = max_bytes or max_message_bytes(self.observation_space, self.action_space)
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, self.max_bytes * HARD_LIMIT_FACTOR)
        if port:
            self.socket.bind(f"tcp://{host}:{port}")
            self.port = port
        else:
            self.port = self.socket.bind_to_random_port(f"tcp://{host}")
        self.host = host
        self.running = False
        self.parallel = parallel
        self.threads: list[threading.Thread] = []
        if parallel:  # one inbox and thread per instance; replies come back over an inproc socket
            self.inboxes: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(capacity)]
            self.replies_address = f"inproc://env_server_replies_{id(self)}"
            self.replies = self.context.socket(zmq.PULL)
            self.replies.bind(self.replies_address)
            for i in range(capacity):
                thread = threading.Thread(target=self._instance_loop, args=(i,), name=f"instance_{i}", daemon=True)
                thread.start()
                self.threads.append(thread)

    def _make(self, i: int) -> gym.Env:
        return self.registry.make(self.env_name, self.cfg, EnvContext(worker_index=0, env_index=i, seed=self.seed + i))

    # ---------------------------------------------------------------- loop
    def serve(self) -> None:
        self.running = True
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        if self.parallel:
            poller.register(self.replies, zmq.POLLIN)
        while self.running:
            ready = dict(poller.poll(POLL_MS))
            if self.parallel and self.replies in ready:  # an instance thread finished a request
                self._send(self.replies.recv_multipart())
            if self.socket not in ready:
                continue
            try:
                frames = self.socket.recv_multipart()
            except zmq.ZMQError:
                continue
            # REQ envelope: [identity, b"", payload...]; anything else cannot be answered
            if len(frames) < 2 or len(frames[1]) != 0:
                continue
            envelope = frames[:2]
            if not self.parallel:
                self._send([*envelope, *self.handle(frames[2:])])
                continue
            request = self.parse(frames[2:])
            if isinstance(request, list):  # an error or a hello/ping: answered right here
                self._send([*envelope, *request])
            else:
                self.inboxes[request[0]].put((envelope, request))

    def _send(self, frames: list) -> None:
        try:
            self.socket.send_multipart(frames)
        except zmq.ZMQError:  # the client went away meanwhile
            pass

    def _instance_loop(self, slot: int) -> None:
        push = self.context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self.replies_address)
        while (item := self.inboxes[slot].get()) is not None:
            envelope, request = item
            push.send_multipart([*envelope, *self.dispatch(request)])
        push.close(0)

    def stop(self) -> None:
        self.running = False

    def close(self) -> None:
        for inbox in getattr(self, "inboxes", ()):
            inbox.put(None)
        for thread in self.threads:
            thread.join(timeout=5.0)  # a thread stuck in its env is a daemon: it cannot hold the exit
        if self.parallel:
            self.replies.close(0)
        for env in self.instances:
            if env is not None:
                try:
                    env.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
        self.socket.close(0)
        if not any(t.is_alive() for t in self.threads):  # a stuck thread's socket would block term() forever
            self.context.term()

    # ---------------------------------------------------------------- requests
    def handle(self, payload: list) -> list[bytes]:
        """One request to its reply. Nothing a client sends can raise out of here."""
        request = self.parse(payload)
        return request if isinstance(request, list) else self.dispatch(request)

    def parse(self, payload: list) -> list[bytes] | tuple[int, str, dict, list]:
        """A checked (slot, command, header, arrays) for an instance, or the finished reply: an error,
        or the answer to a command about the server as a whole (hello, ping)."""
        self.requests += 1
        try:
            header, arrays = unpack(payload, self.max_bytes)
            cmd = header.get("cmd")
            if cmd not in COMMANDS:
                raise ProtocolError(f"unknown command {cmd!r}; known: {', '.join(COMMANDS)}")
            if cmd == "hello":
                return pack({"ok": True, "protocol": PROTOCOL_VERSION, "env": self.env_name,
                             "capacity": self.capacity, "max_message_bytes": self.max_bytes, **self.spaces_json})
            if cmd == "ping":
                return pack({"ok": True, "slots": ["broken" if b else "ok" for b in self.broken]})
            slot = header.get("slot")
            if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < self.capacity:
                raise ProtocolError(f"slot must be an integer in [0, {self.capacity}), got {slot!r}")
            return slot, cmd, header, arrays
        except ProtocolError as exc:
            return error_reply(f"bad request: {exc}")
        except Exception as exc:  # noqa: BLE001 - a server bug must not take the service down
            log.error("internal error: %s", traceback.format_exc())
            return error_reply(f"internal error: {type(exc).__name__}: {exc}")

    def dispatch(self, request: tuple[int, str, dict, list]) -> list[bytes]:
        """Run a parsed request on its instance (on that instance's thread with --parallel)."""
        slot, cmd, header, arrays = request
        try:
            return getattr(self, f"_{cmd}")(slot, header, arrays)
        except ProtocolError as exc:
            return error_reply(f"bad request: {exc}")
        except Exception as exc:  # noqa: BLE001 - a server bug must not take the service down
            log.error("internal error: %s", traceback.format_exc())
            return error_reply(f"internal error: {type(exc).__name__}: {exc}")

    def _env(self, slot: int) -> gym.Env:
        if self.broken[slot] is not None:
            raise ProtocolError(f"slot {slot} is broken ({self.broken[slot]}); restore it first")
        return self.instances[slot]

    def _env_call(self, slot: int, fn, *args, **kwargs):
        """Call into the env; if it raises, the instance is broken (its state is unknown)."""
        try:
            return fn(*args, **kwargs), None
        except Exception as exc:  # noqa: BLE001 - the env's own failure, reported to the client
            self.broken[slot] = f"{type(exc).__name__}: {exc}"
            log.warning("slot %d: env raised %s", slot, self.broken[slot])
            return None, error_reply(f"env failed on slot {slot}: {self.broken[slot]}")

    def _obs_reply(self, header: dict, obs: Any) -> list[bytes]:
        try:
            arrays = obs_arrays(self.observation_space, obs)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            return error_reply(f"env returned an observation that does not fit its space: {exc!r}")
        return pack(header, arrays)

    def _reset(self, slot: int, header: dict, arrays: list) -> list[bytes]:
        env = self._env(slot)
        seed, options = header.get("seed"), header.get("options")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
            raise ProtocolError(f"seed must be a non-negative integer or null, got {seed!r}")
        if options is not None and not isinstance(options, dict):
            raise ProtocolError("options must be a JSON object or null")
        result, failed = self._env_call(slot, env.reset, seed=seed, options=options)
        if failed:
            return failed
        obs, info = result
        return self._obs_reply({"ok": True, "info": json_info(info)}, obs)

    def _step(self, slot: int, header: dict, arrays: list) -> list[bytes]:
        env = self._env(slot)
        if len(arrays) != 1:
            raise ProtocolError(f"step takes one action array, got {len(arrays)}")
        action = space_value(self.action_space, arrays[0])
        result, failed = self._env_call(slot, env.step, action)
        if failed:
            return failed
        obs, reward, terminated, truncated, info = result
        return self._obs_reply({"ok": True, "reward": float(reward), "terminated": bool(terminated),
                                "truncated": bool(truncated), "info": json_info(info)}, obs)

    def _restore(self, slot: int, header: dict, arrays: list) -> list[bytes]:
        """Back to the instance's initial snapshot: the env's own `restore_snapshot()` if it has one
        (cheap for a simulator that can snapshot), else a freshly built instance."""
        env = self.instances[slot]
        if self.broken[slot] is None and hasattr(env, "restore_snapshot"):
            _, failed = self._env_call(slot, env.restore_snapshot)
            return failed or pack({"ok": True})
        try:
            env.close()
        except Exception:  # noqa: BLE001 - the old instance may be the broken part
            pass
        try:
            self.instances[slot] = self._make(slot)
        except Exception as exc:  # noqa: BLE001 - stays broken; the client re-checks later
            self.broken[slot] = f"rebuilding failed: {type(exc).__name__}: {exc}"
            return error_reply(f"env failed on slot {slot}: {self.broken[slot]}")
        self.broken[slot] = None
        return pack({"ok": True})

    def _close(self, slot: int, header: dict, arrays: list) -> list[bytes]:
        return pack({"ok": True})  # instances live as long as the server; a client just lets go
