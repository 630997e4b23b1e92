"""What `ps`, `top` and psutil's name() show for a component process, instead of `python`."""

from __future__ import annotations

import ctypes

# Linux keeps 15 characters of a process's name
_SHORT_NAMES = (("rollout_worker_", "rw"), ("inference_worker_", "inf"), ("learner_rank_", "rank"), ("_proc", ""))


def process_title(name: str) -> str:
    """The OS name of the process hosting `name` (e.g. rollout_worker_3_proc -> sf:rw3)."""
    for long, short in _SHORT_NAMES:
        name = name.replace(long, short)
    return f"sf:{name}"[:15]


def name_process(name: str) -> None:
    """Name this process for the OS (Linux prctl PR_SET_NAME), so a user or a chaos test can tell the
    components apart by name rather than by start order; elsewhere a no-op. It names the calling thread: the
    process, when that is its main thread."""
    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return
    pr_set_name = 15
    prctl(pr_set_name, ctypes.c_char_p(process_title(name).encode()), 0, 0, 0)
