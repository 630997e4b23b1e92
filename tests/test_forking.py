"""Children started in a frozen heap (sf_core/common/forking.py) leave the parent's garbage to the parent."""

from __future__ import annotations

import gc
import multiprocessing
import os

from sf_core.common.forking import frozen_heap


class Cycle:
    """Garbage with a finalizer: a reference cycle only the collector frees."""

    def __init__(self, log: str):
        self.log, self.me = log, self

    def __del__(self):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")


def collect_and_exit() -> None:
    gc.collect()


def finalized_in(tmp_path, frozen: bool) -> list[int]:
    log = str(tmp_path / f"finalized_{frozen}")
    gc.collect()
    gc.disable()  # the cycle stays uncollected in the parent until the fork
    try:
        Cycle(log)
        with frozen_heap() if frozen else open(os.devnull):
            child = multiprocessing.get_context("fork").Process(target=collect_and_exit)
            child.start()
        child.join(timeout=30)
        assert child.exitcode == 0
    finally:
        gc.enable()
    gc.collect()
    with open(log) as f:
        return [int(line) for line in f]


def test_a_forked_child_finalizes_only_what_it_did_not_inherit_frozen(tmp_path):
    assert finalized_in(tmp_path, frozen=True) == [os.getpid()]  # once, by the parent
    unfrozen = finalized_in(tmp_path, frozen=False)  # the child finalizes its copy too
    assert len(unfrozen) == 2 and unfrozen.count(os.getpid()) == 1
