"""What one shard costs in CPU on each side of three Ray call patterns, on a one-node Ray started here.

An actor's thread makes a CartPole-sized shard (110 KB in 15 numpy arrays) 33 times a second, the rate of
the CartPole preset's datasets at about 70k frames/s. The driver takes the shards, three outstanding, in:

- `call`: one actor call per shard, as sf_core's shard ingest makes them (`Sampler.next_shard`);
- `generator`: one streaming-generator call that yields every shard (Ray's back-pressure keeps 3 ahead);
- `compiled`: a Ray Compiled Graph (beta) of the same method, 3 executions in flight.

Each line gives the actor's process and the driver's CPU over --seconds, and per shard:

    unshare -n sh -c 'ip link set lo up && RAY_AUTH_MODE=disabled python scripts/bench_ray_calls.py'

Shards ride inline in the reply as a sampler's do (RAY_max_direct_call_object_size = 1 MiB).
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from typing import Callable

import numpy as np
import psutil

RATE = 33.0
IN_FLIGHT = 3


class ShardMaker:
    def __init__(self):
        self.shards: queue.Queue = queue.Queue(maxsize=8)
        threading.Thread(target=self._make, daemon=True).start()

    def _make(self) -> None:
        while True:
            self.shards.put({f"field_{i}": np.ones(110_000 // 15, dtype=np.uint8) for i in range(15)})
            time.sleep(1 / RATE)

    def pid(self) -> int:
        return os.getpid()

    def next_shard(self, weights: np.ndarray) -> dict:
        return self.shards.get()

    def stream(self, weights: np.ndarray):
        while True:
            yield self.shards.get()


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def timed(actor_process: psutil.Process, take_one: Callable[[], None], seconds: float) -> tuple[float, float, float]:
    """Shards a second, and the actor's and the driver's CPU in % of a core, while take_one runs."""
    me = psutil.Process()
    actor0, driver0, began = cpu_seconds(actor_process), cpu_seconds(me), time.time()
    taken = 0
    while time.time() < began + seconds:
        take_one()
        taken += 1
    elapsed = time.time() - began
    return (taken / elapsed, (cpu_seconds(actor_process) - actor0) / elapsed * 100,
            (cpu_seconds(me) - driver0) / elapsed * 100)


def run_calls(actor, weights: np.ndarray, process: psutil.Process, seconds: float) -> tuple[float, float, float]:
    import ray

    pending = [actor.next_shard.remote(weights) for _ in range(IN_FLIGHT)]

    def take_one():
        ray.get(pending.pop(0), timeout=30)
        pending.append(actor.next_shard.remote(weights))

    for _ in range(10):
        take_one()
    return timed(process, take_one, seconds)


def run_generator(actor, weights: np.ndarray, process: psutil.Process, seconds: float) -> tuple[float, float, float]:
    import ray

    shards = actor.stream.options(_generator_backpressure_num_objects=IN_FLIGHT).remote(weights)
    for _ in range(10):
        ray.get(next(shards), timeout=30)
    return timed(process, lambda: ray.get(next(shards), timeout=30), seconds)


def run_compiled(actor, weights: np.ndarray, process: psutil.Process, seconds: float) -> tuple[float, float, float]:
    import ray
    from ray.dag import InputNode

    with InputNode() as shard_request:
        graph = actor.next_shard.bind(shard_request)
    compiled = graph.experimental_compile(_max_inflight_executions=IN_FLIGHT)
    try:
        pending = [compiled.execute(weights) for _ in range(IN_FLIGHT)]

        def take_one():
            ray.get(pending.pop(0), timeout=30)
            pending.append(compiled.execute(weights))

        for _ in range(10):
            take_one()
        return timed(process, take_one, seconds)
    finally:
        compiled.teardown()  # the executions still in flight are abandoned with the graph


PATTERNS = {"call": run_calls, "generator": run_generator, "compiled": run_compiled}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patterns", default="call,generator,compiled")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["RAY_max_direct_call_object_size"] = str(1 << 20)
    import ray

    ray.init(include_dashboard=False, logging_level="WARNING", num_cpus=2)
    weights = np.ones(18_800 // 4, dtype=np.float32)  # the CartPole preset's model, 18.8 KB
    try:
        for _ in range(args.rounds):
            for name in args.patterns.split(","):
                actor = ray.remote(ShardMaker).options(num_cpus=0, max_concurrency=4).remote()
                process = psutil.Process(ray.get(actor.pid.remote(), timeout=60))
                rate, actor_cpu, driver_cpu = PATTERNS[name](actor, weights, process, args.seconds)
                print(f"{name:9s}: {rate:4.1f} shards/s; actor {actor_cpu:5.1f} % of a core "
                      f"({actor_cpu * 10 / rate:.2f} ms a shard), driver {driver_cpu:5.1f} % "
                      f"({driver_cpu * 10 / rate:.2f} ms a shard)", flush=True)
                ray.kill(actor)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
