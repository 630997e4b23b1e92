"""How tests start programs in a fresh interpreter: entry points (`python -m sf_core.train`, ...),
scripts and user scripts, always with this checkout first on the path.

`run` waits (with a timeout) and returns the CompletedProcess; `start` returns the Popen for a test
that kills, signals or watches it (and must kill it in a `finally`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import IO

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environment(**extra: str) -> dict[str, str]:
    path = REPO + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    return dict(os.environ, PYTHONPATH=path, **extra)


def command(args: list[str], module: str = "sf_core.train", script: str | None = None,
            code: str | None = None) -> list[str]:
    """`python -m MODULE ARGS`, `python SCRIPT ARGS` (a path, relative to the repository or absolute),
    or `python -c CODE ARGS`."""
    if code is not None:
        return [sys.executable, "-c", code, *args]
    if script is not None:
        return [sys.executable, os.path.join(REPO, script), *args]
    return [sys.executable, "-m", module, *args]


def run(args: list[str], timeout: float, module: str = "sf_core.train", script: str | None = None,
        cwd: str | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    """Run to completion with stdout and stderr captured as text."""
    return subprocess.run(command(args, module, script, code), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or REPO, env=environment())


def start(args: list[str], module: str = "sf_core.train", script: str | None = None, cwd: str | None = None,
          output: IO | int | None = subprocess.PIPE) -> subprocess.Popen:
    """Start it; its stdout and stderr go together to `output` (a pipe read as text by default)."""
    stderr = subprocess.STDOUT if output is not None else None
    return subprocess.Popen(command(args, module, script), stdout=output, stderr=stderr, text=True,
                            env=environment(), cwd=cwd or REPO)


def can_isolate() -> bool:
    """Whether this machine lets us make a network namespace (root, or unprivileged user namespaces)."""
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_isolated(args: list[str], timeout: float, script: str) -> subprocess.CompletedProcess:
    """Run a script in a fresh network namespace where only 127.0.0.1 exists (`unshare -n`, then loopback
    up): Ray binds the machine's interface address otherwise. `timeout -k` ends the whole process group,
    Ray's processes included, if it overruns."""
    inner = 'ip link set lo up && exec "$@"'
    wrapped = ["timeout", "-k", "10", str(int(timeout)), "unshare", "-n", "sh", "-c", inner, "sh",
               *command(args, script=script)]
    return subprocess.run(wrapped, capture_output=True, text=True, timeout=timeout + 30, cwd=REPO,
                          env=environment(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0"))
