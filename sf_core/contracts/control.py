"""The control block: shared memory the runner and the components read without any signal.

- Heartbeats: each component stamps (time, activity) as it works.
- The stop flag: set by the runner when it stops, before it emits `stop`; the learner then skips the
  datasets queued behind the stop and saves its checkpoint right away.
- Incarnations: how many times each rollout worker's and each inference worker's process was replaced
  (sf_core/run/worker_replacement.py). A worker tags its policy requests with its own and with its inference
  worker's; an inference worker drops a request of an earlier incarnation of either (a dead process's, or one sent
  to a dead process), and a worker ignores the answers to one.

On heartbeats:

A component stuck inside a slot (an env that never returns, a deadlocked library) cannot send a
message, but the stamp it wrote before starting the activity stays readable: the runner names the
component and what it was doing when the stamp grows older than --heartbeat_timeout. No signal is
involved, so a full queue can never fake a stall or hide one.
"""

from __future__ import annotations

import functools
import time

import torch

ACTIVITIES = ("starting", "waiting for signals", "stepping envs", "resetting envs", "policy forward pass",
              "copying trajectories into a dataset", "training on a dataset", "saving a checkpoint", "stopped",
              "recovering env slots", "waiting for env slots", "joining the Ray cluster", "taking shards",
              "stopping the samplers", "evaluating a checkpoint")
CODE = {name: i for i, name in enumerate(ACTIVITIES)}
STARTUP_TIMEOUT_SEC = 120.0


class Heartbeats:
    def __init__(self, names: list[str]):
        self.names = list(names)
        self.table = torch.zeros((len(names), 2), dtype=torch.float64).share_memory_()
        self.table[:, 0] = time.time()

    def index(self, name: str) -> int:
        return self.names.index(name)

    def __getstate__(self) -> dict:
        return {"names": self.names, "table": self.table}  # the numpy view is made again where it is unpickled

    @functools.cached_property
    def view(self):
        """The table as numpy, made once: `Tensor.numpy()` on every beat was 3 % of a rollout worker's time."""
        return self.table.numpy()

    def beat(self, index: int, activity: str) -> None:
        # store the activity first: a reader may see a new time with an old activity, never the reverse
        view = self.view
        view[index, 1] = CODE[activity]
        view[index, 0] = time.time()

    def all_started(self) -> bool:
        """Every component has beaten at least once: each process is past unpickling what it was given."""
        return not any(ACTIVITIES[int(code)] == "starting" for code in self.table.numpy()[:, 1])

    def stalled(self, timeout: float, now: float | None = None) -> list[tuple[str, float, str]]:
        """(name, seconds silent, last activity) for every component silent longer than timeout.

        A process that has not started yet (importing torch, building envs) gets STARTUP_TIMEOUT_SEC.
        """
        now = now or time.time()
        view = self.table.numpy()
        found = []
        for i, name in enumerate(self.names):
            silent, activity = now - view[i, 0], ACTIVITIES[int(view[i, 1])]
            limit = max(timeout, STARTUP_TIMEOUT_SEC) if activity == "starting" else timeout
            if silent > limit and activity != "stopped":
                found.append((name, silent, activity))
        return found

    def restart(self, name: str) -> None:
        """`name`'s process is being replaced: it is starting again, with the start-up's allowance."""
        self.beat(self.index(name), "starting")


class ControlBlock:
    """Heartbeats (async mode only: in serial mode the runner's own loop is the only one), the stop flag and
    the incarnations of the rollout workers and of the inference workers (`servers`: policy p's i-th at
    p × inference workers per policy + i, `server_index`)."""

    def __init__(self, heartbeat_names: list[str] | None, num_workers: int = 0, num_servers: int = 0):
        self.heartbeats = Heartbeats(heartbeat_names) if heartbeat_names is not None else None
        self._stop = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.incarnations = torch.zeros(max(num_workers, 1), dtype=torch.int64).share_memory_()
        self.servers = torch.zeros(max(num_servers, 1), dtype=torch.int64).share_memory_()

    def incarnation(self, worker: int) -> int:
        return int(self.incarnations.numpy()[worker])

    def next_incarnation(self, worker: int) -> int:
        """The runner, before it starts a new process for rollout worker `worker`."""
        self.incarnations[worker] += 1
        return int(self.incarnations[worker])

    @staticmethod
    def server_index(policy: int, index: int, per_policy: int) -> int:
        """Where inference worker `index` of `policy` is in `servers` (`per_policy`: --policy_workers_per_policy)."""
        return policy * per_policy + index

    def server_incarnation(self, server: int) -> int:
        return int(self.servers.numpy()[server])

    def next_server_incarnation(self, server: int) -> int:
        """The runner, before it starts a new process for that inference worker."""
        self.servers[server] += 1
        return int(self.servers[server])

    def request_stop(self) -> None:
        self._stop[0] = 1

    def stop_requested(self) -> bool:
        return bool(self._stop.numpy()[0])
