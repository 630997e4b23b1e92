"""The cyclic garbage collector during start-up.

Importing torch makes hundreds of thousands of long-lived objects, and every collection the allocations
trigger walks those made so far (docs/performance.md, "Start-up without the garbage collector"). A process
pauses the collector while it imports what it keeps for its whole life, then freezes those objects, so later
collections skip them too. Freezing before forking also keeps the collector from writing to pages a forked
child shares with its parent.

Only a process's first import of torch is paused: a script that calls `sf_core.train.main` again, or has
imported torch itself, has objects of its own alive, and freezing would keep any garbage among them forever.
"""

from __future__ import annotations

import gc
import sys
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with the collector off, then freeze what exists, if torch is not imported yet."""
    if "torch" in sys.modules:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
