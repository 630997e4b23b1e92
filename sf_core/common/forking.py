"""Starting child processes without handing them the parent's garbage to collect."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the collector's view of this process while children are started. A forked child then never runs the
    collector over objects it inherited: garbage the parent had not collected yet carries finalizers (a library's
    threads, locks, handles) that belong to the parent. In one full test run every rollout worker forked by a test
    died with a segfault while garbage-collecting, ten times in a row, and that test passed alone. It also keeps
    the children from writing to the pages they share with the parent (the use gc.freeze documents). The parent
    collects that garbage itself once unfrozen."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
