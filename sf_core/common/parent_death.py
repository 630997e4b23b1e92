"""A component process dies with its parent, even when it is stuck where no watchdog of its own can run."""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the thread that started it ends (Linux; elsewhere a no-op).

    A component's ParentWatchdog checks its parent between slots. A process blocked for good inside one (on a
    signal queue a killed process left locked) never gets there, and outlived a runner killed with SIGKILL;
    the kernel's parent-death signal reaches it wherever it is blocked."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
