"""Every test must leave no child process and no shared-memory file behind."""

import importlib
import os
import time
from types import ModuleType

import psutil
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def extra(module: str, name: str) -> ModuleType:
    """`module` of the optional extra `name`, for a test module that needs it. Where it is missing the test
    module is skipped, so `pytest -m gpu tests` runs on a machine without every extra. Not on CI
    (CI=true), which installs every extra: there a missing one is a broken install, and fails loudly."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"needs the {name} extra: pip install -e '.[{name}]'")


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


def multiprocessing_helper(p: psutil.Process) -> bool:
    """multiprocessing's own per-interpreter helpers: the resource tracker, and a forkserver, which lives as long
    as the interpreter that started it. The processes a forkserver forks carry its command line too: they are
    told apart by their parent, the server."""
    def named(proc: psutil.Process, what: str) -> bool:
        return any(what in part for part in proc.cmdline())

    if named(p, "resource_tracker"):
        return True
    parent = p.parent()
    return named(p, "forkserver") and not (parent is not None and named(parent, "forkserver"))


def _live_children(exclude: set[int]) -> list[psutil.Process]:
    """Our live descendants, except multiprocessing's own helpers."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid in exclude or p.status() == psutil.STATUS_ZOMBIE or multiprocessing_helper(p):
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
