"""How component processes start: fork, a forkserver, or spawn (`--mp_start_method`).

Imports no torch, so the command line can start a forkserver as soon as it has parsed the flags: the
forkserver's own imports (torch and the components' modules, seconds) then run while the trainer imports
torch, probes the env, builds the models and allocates the shared buffers.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import sys
from typing import Any, Mapping

from sf_core.config import ConfigError

# What every component process imports: a forkserver imports it once, and each process forks from it
FORKSERVER_PRELOAD = ["sf_core.machine.forkserver_preload"]


def start_method(requested: str, device: str, threads: int = 1) -> str:
    """`threads`: the most torch threads a component process runs (--torch_threads, --learner_torch_threads)."""
    if requested == "fork" and device.startswith("cuda"):
        raise ConfigError(f"--mp_start_method=fork with --device={device}: a forked process cannot use CUDA once "
                          f"its parent has; use --mp_start_method=forkserver (or auto, which picks it with a GPU)")
    if requested == "fork" and threads > 1:
        raise ConfigError(f"--mp_start_method=fork with components of {threads} torch threads: OpenMP's thread "
                          f"pool does not survive a fork, and a forked process that starts its own after its parent "
                          f"did hangs; use --mp_start_method=forkserver (or auto, which picks it)")
    if requested != "auto":
        return requested
    if not sys.platform.startswith("linux"):
        return "spawn"
    # fork skips re-importing torch in every process (about 2 s on 2 cores); the runner keeps itself
    # fork-safe: one torch thread before forking, no CUDA, no helper threads yet. With CUDA, or components of
    # several torch threads (whose OpenMP pool hangs in a child forked from a parent that used its own, as a
    # notebook's or a test's may have), a forkserver: a fresh process (no CUDA, no pool) that imports
    # FORKSERVER_PRELOAD once, then forks each component
    return "fork" if device == "cpu" and threads == 1 else "forkserver"


def mp_context(method: str):
    """The multiprocessing context of `method`; a forkserver preloads what the components import."""
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)  # only before the server's first start takes effect
    return ctx


def start_forkserver_early(flags: Mapping[str, Any]) -> None:
    """Start the forkserver now, from the command line's flags before they are checked, if the run's components
    will fork from one; a no-op otherwise. Where that guess is wrong (no CUDA after all, or flags refused), the
    idle forkserver exits with this process."""
    device = "cuda" if flags["device"] == "gpu" else flags["device"]
    threads = max(flags["torch_threads"], flags.get("learner_torch_threads") or 1)
    if flags["serial_mode"] or flags["ray_address"] or (flags["mp_start_method"] == "fork" and device != "cpu"):
        return
    if flags["mp_start_method"] == "fork" and threads > 1:
        return  # refused when the flags are checked
    if start_method(flags["mp_start_method"], device, threads) == "forkserver":
        mp_context("forkserver")
        multiprocessing.forkserver.ensure_running()
