"""A two-node Ray cluster on this machine, a training run on it, and optionally the second node killed mid-run.

Run by tests/test_cluster.py (and scripts/benchmark.py's cluster phase) inside a fresh network namespace
(`unshare -n` after `ip link set lo up`), so Ray binds 127.0.0.1 and nothing else. Prints one JSON line:
the training's exit code, its output's tail, and what was killed when.

    python tests/ray_cluster.py --nodes=2 [--kill_node_after_frames=N] -- <sf_core.train flags>
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HEAD_CPUS, NODE_CPUS = 3, 2  # logical CPUs: the head has room for a replacement sampler
OBJECT_STORE_BYTES = 200 * 1024**2
HEALTH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}  # a dead node noticed in ~3 s


def ray_environment() -> dict[str, str]:
    return {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "GLOO_SOCKET_IFNAME": "lo"}


def start_cluster(nodes: int):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": HEAD_CPUS, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False,
        "_system_config": HEALTH})
    workers = [cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE_BYTES) for _ in range(nodes - 1)]
    cluster.wait_for_nodes(timeout=60)
    return cluster, workers


def frames_of(summary_path: str) -> int:
    try:
        with open(summary_path) as f:
            return int(json.load(f).get("frames", 0))
    except (OSError, ValueError):
        return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--kill_node_after_frames", type=int, default=0)
    parser.add_argument("--summary", default="", help="training_summary.json of the run (to decide the kill)")
    parser.add_argument("--timeout", type=float, default=300.0)
    args, train_flags = parser.parse_known_args()
    os.environ.update(ray_environment())
    cluster, workers = start_cluster(args.nodes)
    result: dict = {"killed_at_frames": None}
    try:
        command = [sys.executable, "-m", "sf_core.train", f"--ray_address={cluster.address}",
                   *[f for f in train_flags if f != "--"]]
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output: list[str] = []
        import threading

        reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
        reader.start()
        while proc.poll() is None and time.monotonic() - started < args.timeout:
            if (args.kill_node_after_frames and result["killed_at_frames"] is None and workers
                    and frames_of(args.summary) >= args.kill_node_after_frames):
                result["killed_at_frames"] = frames_of(args.summary)
                cluster.remove_node(workers[-1], allow_graceful=False)
            time.sleep(0.2)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            result["timed_out"] = True
        reader.join(timeout=5)
        result.update(exit_code=proc.returncode, seconds=time.monotonic() - started, output="".join(output)[-6000:])
    finally:
        cluster.shutdown()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
