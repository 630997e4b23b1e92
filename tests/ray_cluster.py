"""A two-node Ray cluster on this machine, a training run on it, and optionally the second node killed mid-run.

Run by tests/test_cluster.py (and scripts/benchmark.py's cluster phase) inside a fresh network namespace
(`unshare -n` after `ip link set lo up`), so Ray binds 127.0.0.1 and nothing else. Prints one JSON line:
the training's exit code, its output's tail, and what was killed when.

    python tests/ray_cluster.py --nodes=2 [--kill_node_after_frames=N] -- <sf_core.train flags>
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HEAD_CPUS, NODE_CPUS = 3, 2  # logical CPUs: the head has room for a replacement sampler
OBJECT_STORE_BYTES = 200 * 1024**2
HEALTH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}  # a dead node noticed in ~3 s


def ray_environment() -> dict[str, str]:
    # RAY_DEDUP_LOGS=0: every node's lines in the driver's output, not one per set of lines alike but for numbers.
    # A head lost for good is given up on after 8 s, not the trainer's 20 (or Ray's 60): the same path, sooner
    return {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "GLOO_SOCKET_IFNAME": "lo",
            "RAY_DEDUP_LOGS": "0", "RAY_gcs_rpc_server_reconnect_timeout_s": "8"}


def start_cluster(nodes: int, node_resources: dict[str, float] | None = None):
    """A head and nodes - 1 more; `node_resources`: custom resources of every node but the head."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": HEAD_CPUS, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False,
        "_system_config": HEALTH})
    workers = [add_node(cluster, node_resources, wait=False) for _ in range(nodes - 1)]
    cluster.wait_for_nodes(timeout=60)
    return cluster, workers


def add_node(cluster, node_resources: dict[str, float] | None = None, wait: bool = True):
    """A node of NODE_CPUS joins `cluster` (a node that comes back, after a kill, is a new one to Ray)."""
    node = cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE_BYTES,
                            resources=node_resources or {})
    if wait:
        cluster.wait_for_nodes(timeout=60)
    return node


def start_env_servers(servers: list, count: int, capacity: int, log_dir: str) -> None:
    """CartPole env servers in this network namespace (the samplers on every node reach them on 127.0.0.1),
    each put in `servers` before it starts, so that a start that fails leaves nothing the caller cannot kill."""
    from tests.helpers import EnvServerProcess

    for _ in range(count):
        servers.append(EnvServerProcess(log_dir, "CartPole-v1", capacity))
        servers[-1].start()


def descendants() -> set:
    import psutil

    return set(psutil.Process().children(recursive=True))


@contextlib.contextmanager
def running_cluster(nodes: int):
    """A cluster for the block; afterwards nothing it started is left running."""
    cluster, workers = start_cluster(nodes)
    spawned = descendants()
    try:
        yield cluster, workers
    finally:
        spawned |= descendants()
        cluster.shutdown()
        reap(spawned | descendants())


def reap(processes: set, timeout: float = 2.0) -> list[int]:
    """End what this cluster started and outlived it: a node killed without grace leaves its agents
    (reparented to init) running for a long while, and they outwait a SIGTERM (ray::DashboardAgent and
    ray::RuntimeEnvAgent took the whole 10 s this once allowed, every time): they have nothing to save."""
    import psutil

    alive = [p for p in processes if p.is_running()]
    for proc in alive:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, still = psutil.wait_procs(alive, timeout=timeout)
    for proc in still:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in alive]


def read_progress(summary_path: str) -> dict:
    """From the run's running summary: its frames, how many nodes have sampled, its mean return, how many
    replacement samplers (later incarnations) have sampled, and whether one has waited for room. A node has
    sampled once its frames are counted: a shard counts the frames of the rollout reports that came with it,
    and a sampler's first shard may come before its workers' first report (a node in node_frames with 0
    frames)."""
    try:
        with open(summary_path) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = {}
    cluster = summary.get("cluster") or {}
    sampled = [frames for frames in cluster.get("node_frames", {}).values() if frames > 0]
    return {"frames": int(summary.get("frames", 0)), "nodes": len(sampled),
            "mean_return": summary.get("mean_return") or float("-inf"),
            "replaced": sum(s["incarnation"] > 0 and s["frames"] > 0 for s in cluster.get("samplers", [])),
            "waiting": any(e["event"] == "waiting" for e in cluster.get("events", []))}


def replaced_since_kill(progress: dict, args, result: dict) -> bool:
    """A sampler started after the node kill (or after the start, without one) has delivered shards."""
    if args.kill_node_after_frames and result["killed_at_frames"] is None:
        return False
    return progress["replaced"] > result.get("replaced_before_kill", 0)


def kill_learner_ranks() -> list[int]:
    """SIGKILL the learner ranks' Ray actor processes (Ray titles a worker by the actor method it runs)."""
    import psutil

    killed = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if "ray::LearnerRank" in " ".join(p.info["cmdline"] or ()):
            p.kill()
            killed.append(p.info["pid"])
    return killed


def act_on(progress: dict, args, result: dict, cluster, workers: list, proc) -> None:
    """The scenario's kills and stops, each once, when the run's progress calls for it."""
    frames, everywhere = progress["frames"], progress["nodes"] >= args.nodes
    # a node is killed once every node has sampled: a sampler can take long to start on a busy machine
    if (args.kill_node_after_frames and result["killed_at_frames"] is None and workers
            and frames >= args.kill_node_after_frames and everywhere):
        result["killed_at_frames"], result["replaced_before_kill"] = frames, progress["replaced"]
        result["killed_at"] = time.monotonic()
        cluster.remove_node(workers[-1], allow_graceful=False)
    if (args.restore_node_after_sec and result["killed_at_frames"] is not None and result["restored_node"] is None
            and (progress["waiting"] or time.monotonic() - result["killed_at"] >= args.restore_node_after_sec)):
        result["restored_at_frames"] = frames
        result["restored_node"] = add_node(cluster, json.loads(args.node_resources or "{}")).node_id
    if args.kill_learner_rank_after_frames and result["rank_killed_at_frames"] is None \
            and frames >= args.kill_learner_rank_after_frames:
        result["rank_killed_at_frames"] = frames
        result["rank_killed_pids"] = kill_learner_ranks()
    if args.kill_cluster_after_frames and result["cluster_killed_at_frames"] is None \
            and frames >= args.kill_cluster_after_frames:
        result["cluster_killed_at_frames"] = frames
        for node in [*workers, cluster.head_node]:
            cluster.remove_node(node, allow_graceful=False)
    if (args.stop_when_replaced_and_return is not None and result["return_reached_at_frames"] is None
            and progress["mean_return"] >= args.stop_when_replaced_and_return):
        result["return_reached_at_frames"] = frames
    if result["stopped_at_frames"] is None and (
            (args.stop_after_frames and frames >= args.stop_after_frames and everywhere)
            or (result["return_reached_at_frames"] is not None and replaced_since_kill(progress, args, result))):
        result["stopped_at_frames"] = frames
        proc.send_signal(signal.SIGTERM)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--kill_node_after_frames", type=int, default=0, help="and once every node sampled")
    parser.add_argument("--restore_node_after_sec", type=float, default=0.0,
                        help="a new node joins in the killed one's place once a replacement sampler waits for room, "
                             "or this long after the kill")
    parser.add_argument("--kill_cluster_after_frames", type=int, default=0, help="every node, the head included")
    parser.add_argument("--kill_learner_rank_after_frames", type=int, default=0, help="SIGKILL to the learner ranks")
    parser.add_argument("--stop_after_frames", type=int, default=0,
                        help="SIGTERM to the trainer, as a user's stop, once every node sampled")
    parser.add_argument("--stop_when_replaced_and_return", type=float, default=None,
                        help="SIGTERM once the mean return has reached this and a replacement sampler has sampled")
    parser.add_argument("--summary", default="", help="training_summary.json of the run (to decide the kill)")
    parser.add_argument("--env_servers", type=int, default=0,
                        help="CartPole env servers to start here; {services} in the training flags lists them")
    parser.add_argument("--env_server_capacity", type=int, default=4)
    parser.add_argument("--node_resources", default="", help="custom resources of the nodes but the head, as JSON")
    parser.add_argument("--timeout", type=float, default=300.0)
    args, train_flags = parser.parse_known_args()
    os.environ.update(ray_environment())
    with tempfile.TemporaryDirectory(prefix="ray_cluster_env_servers_") as log_dir:
        servers: list = []
        try:
            start_env_servers(servers, args.env_servers, args.env_server_capacity, log_dir)
            return on_cluster(args, train_flags, servers)
        finally:
            for server in servers:
                server.kill()


def on_cluster(args: argparse.Namespace, train_flags: list[str], servers: list) -> int:
    """Trains on a cluster started here, acting on its progress as `args` says; prints the result as JSON."""
    cluster, workers = start_cluster(args.nodes, json.loads(args.node_resources or "{}"))
    spawned = descendants()
    result: dict = {"killed_at_frames": None, "cluster_killed_at_frames": None, "stopped_at_frames": None,
                    "rank_killed_at_frames": None, "restored_at_frames": None, "restored_node": None,
                    "return_reached_at_frames": None, "head_node": cluster.head_node.node_id,
                    "other_nodes": [node.node_id for node in workers],
                    "netns": os.stat("/proc/self/ns/net").st_ino}  # the test looks for Ray processes left in it
    try:
        services = ",".join(server.spec for server in servers)
        command = [sys.executable, "-m", "sf_core.train", f"--ray_address={cluster.address}",
                   *[f.replace("{services}", services) for f in train_flags if f != "--"]]
        began = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output: list[str] = []
        import threading

        reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
        reader.start()
        while proc.poll() is None and time.monotonic() - began < args.timeout:
            spawned |= descendants()
            act_on(read_progress(args.summary), args, result, cluster, workers, proc)
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
        result.update(exit_code=proc.returncode, seconds=time.monotonic() - began, output="".join(output)[-6000:],
                      slot_lines=[line.strip() for line in output if " env slots (" in line])
    finally:
        cluster.shutdown()
        result["reaped"] = reap(spawned | descendants())
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
