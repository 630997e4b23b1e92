"""One training run per experiment folder: an exclusive lock, held for the whole run.

`python -m sf_core.train` takes it before it starts anything: `flock` on `run.lock` in the experiment
folder. The kernel drops a flock when its holder ends, however it ends (kill -9 included), so a lock
file that a dead run left behind is taken over by the next run. The file names its holder (pid, host,
start, command line) for the message a second run prints. Component processes forked from the runner
close their copy of it, so a process that outlives its runner does not keep the folder locked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import time
from dataclasses import asdict, dataclass

from sf_core.config import ConfigError

log = logging.getLogger("sf_core")

LOCK_FILE = "run.lock"
HOLDER_WAIT_SEC = 0.5  # a run that has just locked the file writes its details right after
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
_HELD: set[int] = set()  # this process's lock files: a forked child closes its copies


class ExperimentInUse(ConfigError):
    """Another process is training in this experiment folder (a usage error: exit code 2)."""


@dataclass(frozen=True)
class Holder:
    """The run holding the lock, as its lock file records it."""

    pid: int
    host: str
    since: float
    command: str

    @classmethod
    def this_process(cls) -> "Holder":
        return cls(os.getpid(), socket.gethostname(), time.time(), shlex.join(sys.orig_argv))

    @classmethod
    def parse(cls, text: str) -> "Holder | None":
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError):  # empty (being written) or not ours
            return None

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host}, since {since}"


class ExperimentLock:
    """The lock of one experiment folder: `acquire`, then `release` on every way out."""

    def __init__(self) -> None:
        self.path: str | None = None
        self._fd: int | None = None
        self._made: list[str] = []  # folders `acquire` created, deepest first: removed again if left empty

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, experiment_path: str) -> None:
        """Lock the folder (created if need be), or raise ExperimentInUse naming the run that holds it."""
        try:
            self._made = _make_dirs(experiment_path)
            self.path = os.path.join(experiment_path, LOCK_FILE)
            fd = self._lock(experiment_path)
            previous = _read_holder(fd, wait=0.0)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(asdict(Holder.this_process())).encode(), 0)
        except OSError as exc:
            self.release()
            raise ConfigError(f"cannot lock the experiment folder {experiment_path}: {exc}") from None
        except BaseException:
            self.release()
            raise
        if previous is not None:
            log.warning("took over the lock of %s, which is no longer running", previous.describe())

    def _lock(self, experiment_path: str) -> int:
        assert self.path is not None
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            self._fd = fd
            _HELD.add(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd, wait=HOLDER_WAIT_SEC)
                self._close()
                raise ExperimentInUse(_in_use(experiment_path, holder)) from None
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                log.warning("cannot lock %s (%s): nothing keeps another run from training in this folder at the "
                            "same time", self.path, exc.strerror)
                return fd
            if _still_named(fd, self.path):
                return fd
            self._close()  # its holder removed it on the way out as we opened it: lock the file there now

    def release(self) -> None:
        """Remove the lock file and unlock it, then the folders `acquire` made if the run left them empty.
        Safe to call more than once, or after a failed `acquire`."""
        if self._fd is not None:
            # removed while still locked: a run that opened this file meanwhile finds it unnamed, and retries
            with contextlib.suppress(OSError):
                if _still_named(self._fd, self.path):
                    os.remove(self.path)
            self._close()
        for folder in self._made:
            try:
                os.rmdir(folder)
            except OSError:  # the run wrote into it, or another process did
                break
        self._made = []

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            _HELD.discard(fd)
            os.close(fd)  # the last descriptor of the file: the flock goes with it


def _make_dirs(path: str) -> list[str]:
    missing, folder = [], os.path.abspath(path)
    while not os.path.isdir(folder) and folder != os.path.dirname(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    os.makedirs(path, exist_ok=True)
    return missing


def _still_named(fd: int, path: str | None) -> bool:
    try:
        named = os.stat(path) if path else None
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return named is not None and (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _read_holder(fd: int, wait: float) -> Holder | None:
    deadline = time.monotonic() + wait
    while True:
        holder = Holder.parse(os.pread(fd, 65536, 0).decode(errors="replace"))
        if holder is not None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.02)


def _in_use(experiment_path: str, holder: Holder | None) -> str:
    if holder is None:
        who, stop = "another training run", "stop it"
    else:
        elsewhere = f" on {holder.host}" if holder.host != socket.gethostname() else ""
        who, stop = f"another training run ({holder.describe()})", f"stop it (kill {holder.pid}{elsewhere})"
    return (f"the experiment folder {experiment_path} is in use by {who}: wait for it to finish, {stop}, "
            f"or train into another --experiment")


def _close_in_child() -> None:
    """A forked process closes its copy of the descriptor (never unlocks it: the lock is its parent's)."""
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)
