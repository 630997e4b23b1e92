"""Memory over a long run: total RSS/PSS of the trainer and all its processes, sampled over time.

    python scripts/memory_soak.py --minutes=20 -- --env=CartPole-v1

Everything after `--` goes to `python -m sf_core.train`. Prints a sample every --every seconds and,
at the end, the growth of total RSS and PSS from the first minute to the end (the issue's target: < 5 %).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time

import psutil


def tree_memory(root: psutil.Process) -> tuple[float, float]:
    rss = pss = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            info = p.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
        except psutil.Error:
            continue
    return rss / 2**20, pss / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--output", default=None, help="JSON file for the samples")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    extra = [a for a in args.trainer_args if a != "--"] or ["--env=CartPole-v1"]
    train_dir = tempfile.mkdtemp(prefix="memory_soak_")
    cmd = [sys.executable, "-m", "sf_core.train", *extra, f"--train_dir={train_dir}", "--experiment=soak",
           "--train_for_env_steps=100000000000", f"--train_for_seconds={args.minutes * 60 + 60}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []
    try:
        root = psutil.Process(proc.pid)
        started = time.time()
        while time.time() - started < args.minutes * 60 and proc.poll() is None:
            time.sleep(args.every)
            rss, pss = tree_memory(root)
            samples.append({"t": round(time.time() - started, 1), "rss_mb": round(rss, 1), "pss_mb": round(pss, 1)})
            print(f"{samples[-1]['t']:7.1f}s  RSS {rss:8.1f} MB  PSS {pss:8.1f} MB", flush=True)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    after_first_minute = [s for s in samples if s["t"] >= 60]
    if len(after_first_minute) < 2:
        print("run too short to compare against the first minute")
        return 1
    first, last = after_first_minute[0], after_first_minute[-1]
    growth = {k: (last[k] - first[k]) / first[k] for k in ("rss_mb", "pss_mb")}
    print(f"from {first['t']:.0f}s to {last['t']:.0f}s: RSS {first['rss_mb']:.0f} -> {last['rss_mb']:.0f} MB "
          f"({growth['rss_mb']:+.1%}), PSS {first['pss_mb']:.0f} -> {last['pss_mb']:.0f} MB ({growth['pss_mb']:+.1%})")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"command": cmd, "samples": samples, "growth": growth}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
