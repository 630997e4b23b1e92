"""How component processes allocate: glibc keeps big freed blocks for the next allocation."""

from __future__ import annotations

import ctypes


def reuse_freed_memory() -> None:
    """Let glibc keep big freed blocks for the next allocation instead of returning them to the OS.

    Above its mmap threshold (32 MiB at most) glibc maps every allocation afresh and unmaps it on
    free, so each new tensor of that size pays a page fault per 4 KiB page when first written: 512
    stacked Atari frames as float32 are 58 MiB, ~14k faults per conversion. Training allocates the
    same sizes over and over: after a few iterations the heap holds a few copies of the biggest
    block (torch's aligned allocations leave gaps) and stops growing (tests/test_allocator.py,
    docs/performance.md). Linux/glibc only; elsewhere the allocator is left as it is.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h> parameter numbers
    mallopt(m_mmap_threshold, 1 << 30)  # blocks up to 1 GiB come from the heap
    mallopt(m_trim_threshold, 1 << 30)  # free memory at the heap's top is kept up to 1 GiB
