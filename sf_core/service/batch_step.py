"""Stepping several pooled envs at once: one `steps` message per server, every reply awaited together.

A split's envs sit on slots of one or more servers. `BatchStepper.step` sends each server one message
naming all of the split's slots it hosts, then collects the replies (one per slot, in whatever order the
server finishes them) until all are in or `timeout` has passed since the send. So a split of four
20 ms envs on a `--parallel=True` server takes about 20 ms, not 80, and a split spread over two servers
waits for the slower one, not for their sum.

A slot that answers with an error, or not in time, loses its env's slot (the pool marks it failed and
health-checks it, as for a single request) and is returned as `SlotLost`; the other slots' results are
returned as usual. A late reply that arrives after its request gave up is recognised by its request id
and dropped (and the socket of a server that timed out is replaced, so nothing late is ever read).
"""

from __future__ import annotations

import time
from itertools import count
from typing import Any, NamedTuple

import numpy as np

from sf_core.service.pooled_env import PooledEnv
from sf_core.service.slot import SlotLost
from sf_core.service.protocol import leaf_spaces, max_message_bytes, space_array
from sf_core.service.remote_env import RemoteEnv, ServerChannel, ServiceError, ServiceTimeout


class StepResult(NamedTuple):
    """One env's step; with autoreset, `reset_obs` is the first observation of the episode that follows."""

    obs: Any
    reward: float
    terminated: bool
    truncated: bool
    info: dict
    reset_obs: Any = None


class BatchStepper:
    """Batched steps of pooled envs, all on one pool. Owned by one thread: its sockets are that thread's."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.channels: dict[str, ServerChannel] = {}
        self.ids = count(1)

    def step(self, envs: list[PooledEnv], actions: list[Any], autoreset: bool) -> list[StepResult | SlotLost]:
        results: list[StepResult | SlotLost | None] = [None] * len(envs)
        waiting: dict[tuple[str, int], int] = {}  # (address, slot index) -> env number
        for e, env in enumerate(envs):
            try:
                if env.slot is None:
                    raise SlotLost("this env lost its slot: it must be reset on another one")
                env._check_suspect()
                waiting[(env.slot.address, env.slot.index)] = e
            except ServiceError as exc:
                results[e] = exc if isinstance(exc, SlotLost) else env._lose(exc)
        request_id = next(self.ids)
        for address in dict.fromkeys(address for address, _ in waiting):
            mine = [(index, e) for (a, index), e in waiting.items() if a == address]
            header = {"cmd": "steps", "id": request_id, "slots": [index for index, _ in mine], "autoreset": autoreset}
            arrays = [space_array(envs[e].action_space, actions[e]) for _, e in mine]
            try:
                self._channel(envs[mine[0][1]]).send(header, arrays)
            except ServiceError as exc:
                for index, e in mine:
                    results[e] = envs[e]._lose(exc)
                    del waiting[(address, index)]
                continue
            for _, e in mine:  # the servers' load, as the pool sees it (sf_core/service/slot_choice.py)
                envs[e].slot.in_flight += 1
        self._collect(envs, request_id, waiting, results, autoreset)
        assert all(r is not None for r in results), "every env gets a result or its SlotLost"
        return results  # type: ignore[return-value]

    def _collect(self, envs: list[PooledEnv], request_id: int, waiting: dict[tuple[str, int], int],
                 results: list, autoreset: bool) -> None:
        deadline = time.monotonic() + self.timeout
        while waiting:
            progress = False
            for address in dict.fromkeys(a for a, _ in waiting):
                reply = self.channels[address].receive(0.0)
                while reply is not None:
                    progress |= self._take(envs, request_id, address, reply, waiting, results, autoreset)
                    reply = self.channels[address].receive(0.0)
            if not waiting or progress:
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wait_any(waiting, remaining)
        for (address, index), e in list(waiting.items()):  # no answer in time: those slots are lost
            self.channels[address].reset_socket()
            envs[e].slot.in_flight -= 1
            results[e] = envs[e]._lose(ServiceTimeout(f"{address} did not answer 'steps' for slot {index} "
                                                      f"within {self.timeout:g}s"))

    def _wait_any(self, waiting: dict[tuple[str, int], int], timeout: float) -> None:
        """Block until a reply may be there on any of the servers still owing one, or `timeout`."""
        import zmq  # with the sockets that wait here (sf_core/service/remote_env.py says why not before)

        poller = zmq.Poller()
        for address in dict.fromkeys(a for a, _ in waiting):
            channel = self.channels[address]
            if channel.replies:
                return
            if channel.socket is not None:
                poller.register(channel.socket, zmq.POLLIN)
        poller.poll(int(timeout * 1000) + 1)

    def _take(self, envs: list[PooledEnv], request_id: int, address: str, reply: tuple[dict, list],
              waiting: dict[tuple[str, int], int], results: list, autoreset: bool) -> bool:
        header, arrays = reply
        e = waiting.pop((address, header.get("slot")), None) if header.get("id") == request_id else None
        if e is None:
            return False  # a late answer to an earlier request that gave up on it
        env = envs[e]
        env.slot.in_flight -= 1
        if header.get("ok") is not True:
            results[e] = env._lose(ServiceError(f"{address}: {header.get('error', 'error without a message')}"))
            return True
        try:
            results[e] = self._result(env.pool._connect(env.slot), header, arrays, autoreset)
        except (ServiceError, KeyError, TypeError, ValueError) as exc:
            results[e] = env._lose(exc if isinstance(exc, ServiceError) else
                                   ServiceError(f"{address} sent a malformed step reply: {exc!r}"))
        return True

    @staticmethod
    def _result(remote: RemoteEnv, header: dict, arrays: list[np.ndarray], autoreset: bool) -> StepResult:
        n = len(leaf_spaces(remote.observation_space))
        done = bool(header["terminated"]) or bool(header["truncated"])
        expected = 2 * n if autoreset and done else n
        if len(arrays) != expected:
            raise ServiceError(f"{remote.address} sent {len(arrays)} observation arrays, expected {expected}")
        return StepResult(remote._obs(arrays[:n]), float(header["reward"]), bool(header["terminated"]),
                          bool(header["truncated"]), header.get("info", {}),
                          remote._obs(arrays[n:]) if expected > n else None)

    def _channel(self, env: PooledEnv) -> ServerChannel:
        address = env.slot.address
        if address not in self.channels:
            self.channels[address] = ServerChannel(address, max_message_bytes(env.observation_space,
                                                                              env.action_space))
        return self.channels[address]

    def close(self) -> None:
        for channel in self.channels.values():
            channel.reset_socket()
        self.channels.clear()
