"""`python -m sf_core.env_server --env=NAME --port=P --capacity=C`: serve C instances of a registered env.

Clients (sf_core/service/remote_env.py) talk to it over ZeroMQ (a ROUTER socket here, REQ or DEALER sockets
there) with the format in sf_core/service/protocol.py: a JSON header and raw array frames, never pickles. Every
request names an instance (its slot), except `steps`, which names several: it is answered with one reply per
slot, each sent as soon as its instance has stepped, so one slow instance delays only its own answer. A
request that is malformed, truncated or too big is answered with an error and the server carries on; an env
that raises marks only its instance broken until a `restore` rebuilds it. `close` closes one instance (a
slot drained from its pools, sf_core/service/env_pool.py): `ping` says `closed`, and the slot takes no
request but `restore`, which builds it anew.

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
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import zmq

from sf_core.envs.registry import EnvContext, EnvRegistry, registry_snapshot
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


@dataclass
class Request:
    """One checked request for one instance (a `steps` message becomes one per slot it names)."""

    slot: int
    cmd: str
    header: dict
    arrays: list


class EnvServer:
    """C env instances behind one ROUTER socket. `serve()` runs until `stop()` (or a signal)."""

    def __init__(self, env: str, capacity: int, host: str | None = "127.0.0.1", port: int = 0, seed: int = 0,
                 registry: EnvRegistry | None = None, cfg: Config | None = None, max_bytes: int | None = None,
                 parallel: bool = False):
        if capacity < 1:
            raise ValueError(f"--capacity must be at least 1, got {capacity}")
        self.env_name, self.capacity, self.seed = env, capacity, seed
        self.registry = registry or registry_snapshot()
        self.cfg = cfg or Config(env=env)
        self.instances: list[gym.Env | None] = [None] * capacity
        self.broken: list[str | None] = [None] * capacity  # why an instance is unusable until restored
        self.closed = [False] * capacity  # closed by a client (drained): no instance until restored
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
        self.running = False
        self.parallel = parallel and host is not None
        self.threads: list[threading.Thread] = []
        self.host, self.port = host, 0
        self.context: zmq.Context | None = None
        self.socket: zmq.Socket | None = None
        if host is not None:  # None: in-process (skip mode, sf_core/service/skip.py), answered by handle_all()
            self._listen(host, port)

    def _listen(self, host: str, port: int) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, self.max_bytes * HARD_LIMIT_FACTOR)
        if port:
            self.socket.bind(f"tcp://{host}:{port}")
            self.port = port
        else:
            self.port = self.socket.bind_to_random_port(f"tcp://{host}")
        if self.parallel:  # one inbox and thread per instance; replies come back over an inproc socket
            self.inboxes: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(self.capacity)]
            self.replies_address = f"inproc://env_server_replies_{id(self)}"
            self.replies = self.context.socket(zmq.PULL)
            self.replies.bind(self.replies_address)
            for i in range(self.capacity):
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
            reply, requests = self.parse(frames[2:])
            if reply is not None:  # an error or a hello/ping: answered right here
                self._send([*envelope, *reply])
            for request in requests:
                if self.parallel:
                    self.inboxes[request.slot].put((envelope, request))
                else:
                    self._send([*envelope, *self.dispatch(request)])

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
        if self.socket is not None:
            self.socket.close(0)
        # a stuck thread's socket would block term() forever
        if self.context is not None and not any(t.is_alive() for t in self.threads):
            self.context.term()

    # ---------------------------------------------------------------- requests
    def handle(self, payload: list) -> list[bytes]:
        """One request to its reply (the first, for a `steps` request). Nothing a client sends can raise out of here."""
        return self.handle_all(payload)[0]

    def handle_all(self, payload: list) -> list[list[bytes]]:
        """Every reply to one request, in order, without sockets: one per slot for `steps`."""
        reply, requests = self.parse(payload)
        return [reply] if reply is not None else [self.dispatch(r) for r in requests]

    def parse(self, payload: list) -> tuple[list[bytes] | None, list[Request]]:
        """The checked requests for instances, or else the finished reply: an error, or the answer to a
        command about the server as a whole (hello, ping)."""
        self.requests += 1
        try:
            header, arrays = unpack(payload, self.max_bytes)
            cmd = header.get("cmd")
            if cmd not in COMMANDS:
                raise ProtocolError(f"unknown command {cmd!r}; known: {', '.join(COMMANDS)}")
            if cmd == "hello":
                return pack({"ok": True, "protocol": PROTOCOL_VERSION, "env": self.env_name,
                             "capacity": self.capacity, "max_message_bytes": self.max_bytes, **self.spaces_json}), []
            if cmd == "ping":
                return pack({"ok": True, "slots": [self._health(i) for i in range(self.capacity)]}), []
            if cmd == "steps":
                return None, self._split_steps(header, arrays)
            return None, [Request(self._slot(header.get("slot")), cmd, header, arrays)]
        except ProtocolError as exc:
            return error_reply(f"bad request: {exc}"), []
        except Exception as exc:  # noqa: BLE001 - a server bug must not take the service down
            log.error("internal error: %s", traceback.format_exc())
            return error_reply(f"internal error: {type(exc).__name__}: {exc}"), []

    def _slot(self, slot: Any) -> int:
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < self.capacity:
            raise ProtocolError(f"slot must be an integer in [0, {self.capacity}), got {slot!r}")
        return slot

    def _split_steps(self, header: dict, arrays: list) -> list[Request]:
        """`steps`: {"id": n, "slots": [...], "autoreset": bool} and one action per slot, in order."""
        slots, request_id, autoreset = header.get("slots"), header.get("id"), header.get("autoreset", False)
        if not isinstance(slots, list) or not slots:
            raise ProtocolError("steps needs a non-empty list of slots")
        checked = [self._slot(slot) for slot in slots]
        if len(set(checked)) != len(checked):
            raise ProtocolError(f"steps names a slot twice: {slots}")
        if len(arrays) != len(checked):
            raise ProtocolError(f"steps names {len(checked)} slots but sends {len(arrays)} actions")
        if not isinstance(request_id, int) or isinstance(request_id, bool) or not isinstance(autoreset, bool):
            raise ProtocolError("steps needs an integer id and a boolean autoreset")
        return [Request(slot, "step", {"id": request_id, "slot": slot, "autoreset": autoreset}, [action])
                for slot, action in zip(checked, arrays)]

    def dispatch(self, request: Request) -> list[bytes]:
        """Run a parsed request on its instance (on that instance's thread with --parallel). A reply to
        one slot of a `steps` request names the request and the slot, errors included."""
        tag = {key: request.header[key] for key in ("id", "slot") if "id" in request.header}
        try:
            return getattr(self, f"_{request.cmd}")(request.slot, request.header, request.arrays)
        except ProtocolError as exc:
            return error_reply(f"bad request: {exc}", tag)
        except Exception as exc:  # noqa: BLE001 - a server bug must not take the service down
            log.error("internal error: %s", traceback.format_exc())
            return error_reply(f"internal error: {type(exc).__name__}: {exc}", tag)

    def _health(self, slot: int) -> str:
        return "closed" if self.closed[slot] else "broken" if self.broken[slot] else "ok"

    def _env(self, slot: int) -> gym.Env:
        if self.closed[slot]:
            raise ProtocolError(f"slot {slot} is closed (drained); restore it to open it again")
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

    def _obs_reply(self, header: dict, *observations: Any) -> list[bytes]:
        try:
            arrays = [a for obs in observations for a in obs_arrays(self.observation_space, obs)]
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            tag = {key: header[key] for key in ("id", "slot") if "id" in header}
            return error_reply(f"env returned an observation that does not fit its space: {exc!r}", tag)
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
        """One step; in a `steps` request with autoreset, an instance whose episode ended is reset at once
        and the reply carries the final observation, then the first one of the next episode."""
        tag = {key: header[key] for key in ("id", "slot") if "id" in header}
        env = self._env(slot)
        if len(arrays) != 1:
            raise ProtocolError(f"step takes one action array, got {len(arrays)}")
        action = space_value(self.action_space, arrays[0])
        result, failed = self._env_call(slot, env.step, action)
        if failed:
            return error_reply(f"env failed on slot {slot}: {self.broken[slot]}", tag)
        obs, reward, terminated, truncated, info = result
        reply = {"ok": True, **tag, "reward": float(reward), "terminated": bool(terminated),
                 "truncated": bool(truncated), "info": json_info(info)}
        if not (header.get("autoreset") and (terminated or truncated)):
            return self._obs_reply(reply, obs)
        reset, failed = self._env_call(slot, env.reset)
        if failed:
            return error_reply(f"env failed on slot {slot}: {self.broken[slot]}", tag)
        next_obs, reset_info = reset
        return self._obs_reply({**reply, "reset_info": json_info(reset_info)}, obs, next_obs)

    def _restore(self, slot: int, header: dict, arrays: list) -> list[bytes]:
        """Back to the instance's initial snapshot: the env's own `restore_snapshot()` if it has one
        (cheap for a simulator that can snapshot), else a freshly built instance."""
        env = self.instances[slot]
        if env is not None and self.broken[slot] is None and hasattr(env, "restore_snapshot"):
            _, failed = self._env_call(slot, env.restore_snapshot)
            return failed or pack({"ok": True})
        self._close_instance(slot)
        self.closed[slot] = False  # reopened: from here on it is either built or broken
        try:
            self.instances[slot] = self._make(slot)
        except Exception as exc:  # noqa: BLE001 - stays broken; the client re-checks later
            self.broken[slot] = f"rebuilding failed: {type(exc).__name__}: {exc}"
            return error_reply(f"env failed on slot {slot}: {self.broken[slot]}")
        self.broken[slot] = None
        return pack({"ok": True})

    def _close(self, slot: int, header: dict, arrays: list) -> list[bytes]:
        """The slot leaves service (drained): its instance is closed, and what it held (a simulator, a VM)
        is freed, until a `restore` builds it anew."""
        self._close_instance(slot)
        self.broken[slot], self.closed[slot] = None, True
        log.info("slot %d closed", slot)
        return pack({"ok": True})

    def _close_instance(self, slot: int) -> None:
        env, self.instances[slot] = self.instances[slot], None
        if env is None:
            return
        try:
            env.close()
        except Exception:  # noqa: BLE001 - the old instance may be the broken part
            pass
