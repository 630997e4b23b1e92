"""Every test must leave no child process and no shared-memory file behind."""

import os
import time

import psutil
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shm_files() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def _ours_or_orphaned(name: str) -> bool:
    """torch names segments torch_<pid>_...: ours if <pid> is this process or a descendant, orphaned if
    that process is gone. A live unrelated process's segment (another program) is not our leak."""
    parts = name.split("_")
    if len(parts) < 2 or parts[0] != "torch" or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid() or not psutil.pid_exists(pid):
        return True
    return pid in {p.pid for p in psutil.Process().children(recursive=True)}


def _live_children(exclude: set[int]) -> list[psutil.Process]:
    """Our live descendants, except multiprocessing's own per-interpreter helper (resource tracker)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid in exclude or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if any("resource_tracker" in part or "forkserver" in part for part in p.cmdline()):
                continue
            found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.fixture(autouse=True)
def no_leftovers():
    before_children = {p.pid for p in psutil.Process().children(recursive=True)}
    before_shm = _shm_files()
    yield
    deadline = time.time() + 10
    leftover = _live_children(before_children)
    while leftover and time.time() < deadline:
        time.sleep(0.1)
        leftover = _live_children(before_children)
    described = [(p.pid, p.name()) for p in leftover]
    for p in leftover:
        p.kill()
    assert not leftover, f"child processes left behind: {described}"
    new_shm = {f for f in _shm_files() - before_shm if _ours_or_orphaned(f)}
    assert not new_shm, f"shared-memory files left behind: {sorted(new_shm)}"
