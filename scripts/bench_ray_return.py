"""Time one actor call that returns a shard-sized dict of numpy arrays, through Ray's object store (Ray's
default for values over 100 KiB) and inline in the call's reply (what sf_core's samplers ask for up to
sf_core.cluster.placement.INLINE_RETURN_BYTES), on a one-node Ray started here. The actor has a sampler's
options (placement.sampler_options); the object-store case sets RAY_max_direct_call_object_size back to
Ray's default, as a user's driver environment would.

    unshare -n sh -c 'ip link set lo up && RAY_AUTH_MODE=disabled python scripts/bench_ray_return.py'

Calls are kept 4 deep, as the shard ingest keeps --shards_in_flight calls per sampler; each result is
fetched, as the ingest does. The two ways alternate for --rounds rounds; each line is one round.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from sf_core.cli.arguments import parse_args  # noqa: E402
from sf_core.cluster.placement import INLINE_RETURN_BYTES, sampler_options  # noqa: E402

RAY_DEFAULT_INLINE = 100 * 1024


class ShardSource:
    def __init__(self, nbytes: int):
        self.data = np.ones(nbytes, dtype=np.uint8)

    def shard(self) -> dict[str, np.ndarray]:
        return {"obs": self.data.copy()}


def calls_per_second(nbytes: int, inline_limit: int, calls: int, depth: int = 4) -> float:
    import ray

    os.environ["RAY_max_direct_call_object_size"] = str(inline_limit)  # sampler_options passes it on
    options = sampler_options(parse_args(["--env=CartPole-v1"])[0])
    options.update(num_cpus=0, max_concurrency=1)  # the probe's own: its calls are what is timed
    actor = ray.remote(ShardSource).options(**options).remote(nbytes)
    ray.get(actor.shard.remote(), timeout=60)
    began = time.perf_counter()
    pending = [actor.shard.remote() for _ in range(depth)]
    for _ in range(calls):
        ray.get(pending.pop(0), timeout=60)
        pending.append(actor.shard.remote())
    seconds = time.perf_counter() - began
    ray.get(pending, timeout=60)
    ray.kill(actor)
    return calls / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, default=110_000, help="a shard's size (CartPole preset: 110 KB)")
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(include_dashboard=False, logging_level="WARNING", num_cpus=2)
    try:
        for _ in range(args.rounds):
            for label, limit in (("object store", RAY_DEFAULT_INLINE), ("inline", INLINE_RETURN_BYTES)):
                rate = calls_per_second(args.bytes, limit, args.calls)
                print(f"{args.bytes:,} bytes, {label:12s}: {rate:,.0f} calls/s ({1000 / rate:.2f} ms a call)",
                      flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
