"""The cluster phase: our trainer on a Ray cluster of one or two nodes on this machine.

Each case runs `python scripts/benchlib/cluster.py CASE ...` inside a fresh network namespace (`unshare -n`,
loopback up: Ray binds 127.0.0.1 only), which starts the cluster (tests/ray_cluster.py's settings), measures
the trainer exactly as the training phase does (benchlib.ours), stops the cluster and prints the phase's
result as one JSON line. Cases:

  cluster_1_sampler   the run's own flags with --ray_address and one sampler on one node: the cost of the
                      cluster path, against the training phase (ratio cluster_vs_training)
  slow_1_node         an env whose step sleeps 2 ms (benchlib.slow_env), one node, one sampler
  slow_2_nodes        the same on two nodes, two samplers (ratio slow_2_nodes_vs_1_node)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(SCRIPTS)
SLOW_ENV = "benchlib.slow_env:SleepyCartPole-v1"
SLOW_STEP_MS = 2.0
# a slow env's node: one worker of 16 envs (the env waits, not the CPU); the same for one node and two
SLOW_FLAGS = ["--num_workers=2", "--num_envs_per_worker=8", "--worker_num_splits=2"]
CASES = {"cluster_1_sampler": 1, "slow_1_node": 1, "slow_2_nodes": 2}


def run_case(case: str, args: argparse.Namespace, cfg_argv: list[str], extra: list[str], work_dir: str) -> dict:
    """From the benchmark's process: the case in its namespace; its result (or why it failed)."""
    inner = [sys.executable, os.path.abspath(__file__), case, f"--cfg_argv={shlex.join(cfg_argv)}",
             f"--extra={shlex.join(extra)}", f"--work_dir={work_dir}", f"--warmup={args.warmup}",
             f"--seconds={args.seconds}", f"--startup_timeout={args.startup_timeout}", f"--python={args.python}"]
    bound = args.startup_timeout + args.warmup + args.seconds + 180
    command = ["timeout", "-k", "10", str(int(bound)), "unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"',
               "sh", *inner]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", SF_BENCH_STEP_MS=str(SLOW_STEP_MS),
               PYTHONPATH=os.pathsep.join([REPO, SCRIPTS, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=bound + 30)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"status": "failed", "error": f"exit code {proc.returncode}", "output_tail": proc.stderr[-3000:]}
    return json.loads(lines[-1])


def main() -> int:
    sys.path[:0] = [REPO, SCRIPTS, os.path.join(REPO, "tests")]
    from benchlib.ours import run_ours
    from ray_cluster import ray_environment, running_cluster

    p = argparse.ArgumentParser()
    p.add_argument("case", choices=sorted(CASES))
    for name in ("cfg_argv", "extra", "work_dir", "python"):
        p.add_argument(f"--{name}", default="")
    for name in ("warmup", "seconds", "startup_timeout"):
        p.add_argument(f"--{name}", type=float)
    args = p.parse_args()
    args.verbose = False
    os.environ.update(ray_environment())
    nodes = CASES[args.case]
    cfg_argv, extra = shlex.split(args.cfg_argv), shlex.split(args.extra)
    if args.case.startswith("slow"):
        cfg_argv, extra = [f"--env={SLOW_ENV}"], SLOW_FLAGS
    with running_cluster(nodes) as (cluster, _):
        flags = [*extra, f"--ray_address={cluster.address}", f"--num_samplers={nodes}"]
        result = run_ours(args.case, args, cfg_argv, flags, args.work_dir, sampling_only=False)
    result["nodes"] = nodes
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
