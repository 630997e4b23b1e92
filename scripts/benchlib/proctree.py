"""Process trees: memory sampling while a phase runs, and leaving nothing behind once it ends.

Every phase starts processes that start processes (a trainer's components, multiprocessing's
resource tracker, Sample Factory's workers). A benchmark that is stopped, fails or is interrupted must
not leave any of them running, nor the shared-memory files they created in /dev/shm.
"""

from __future__ import annotations

import glob
import os
import shlex
import signal
import subprocess
import threading

import psutil

MB = 1024 * 1024
MEMORY_SAMPLE_SEC = 0.5


class Interrupted(Exception):
    """SIGTERM received by the benchmark (Ctrl-C is KeyboardInterrupt): stop and write what we have."""


class TreeMonitor(threading.Thread):
    """Samples RSS/PSS summed over some root processes and all their descendants; remembers every
    process it has seen, so the whole tree can be killed even after a parent died."""

    def __init__(self, roots: list[int], interval: float = MEMORY_SAMPLE_SEC):
        super().__init__(name="tree_monitor", daemon=True)
        self.interval = interval
        self.seen: dict[int, psutil.Process] = {}
        self.cmdlines: dict[int, str] = {}
        for pid in roots:
            self._remember(pid)
        self.roots = list(roots)
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_processes = 0
        self.samples = 0
        self.pss_available = True
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def _remember(self, pid: int) -> psutil.Process | None:
        proc = self.seen.get(pid)
        if proc is None:
            try:
                proc = psutil.Process(pid)
            except psutil.Error:
                return None
            self._add(proc)
        return proc

    def _add(self, proc: psutil.Process) -> psutil.Process:
        if proc.pid not in self.seen:
            self.seen[proc.pid] = proc
            self.cmdlines[proc.pid] = cmdline(proc)  # kept: a dying process can no longer tell
        return self.seen[proc.pid]

    def processes(self) -> list[psutil.Process]:
        """The roots and their live descendants right now (and remember them)."""
        found: dict[int, psutil.Process] = {}
        with self._lock:
            for pid in self.roots:
                root = self._remember(pid)
                if root is None or not root.is_running():
                    continue
                found[root.pid] = root
                try:
                    for child in root.children(recursive=True):
                        found[child.pid] = self._add(child)
                except psutil.Error:
                    pass
        return list(found.values())

    def sample(self) -> None:
        rss = pss = 0
        procs = self.processes()
        for proc in procs:
            try:
                if self.pss_available:
                    try:
                        info = proc.memory_full_info()
                        rss += info.rss
                        pss += getattr(info, "pss", info.rss)
                        continue
                    except psutil.AccessDenied:
                        self.pss_available = False
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
        self.samples += 1
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_processes = max(self.peak_processes, len(procs))

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)

    def report(self) -> dict:
        return {"peak_rss_mb": round(self.peak_rss / MB, 1) if self.samples else None,
                "peak_pss_mb": round(self.peak_pss / MB, 1) if self.samples and self.pss_available else None,
                "peak_processes": self.peak_processes, "memory_samples": self.samples}

    def kill_all(self, grace: float) -> list[str]:
        """SIGKILL every process of the tree still alive `grace` seconds from now (they were asked to
        stop before); returns a description of each one killed.

        multiprocessing's resource tracker goes last: once the others are gone it unlinks the
        semaphores and shared memory they leaked, and exits by itself."""
        self.processes()  # pick up children forked since the last sample
        with self._lock:
            alive = [p for p in self.seen.values() if _running(p)]
        _, alive = psutil.wait_procs(alive, timeout=grace)  # exiting on their own: let them
        trackers = [p for p in alive if "resource_tracker" in self.cmdlines.get(p.pid, "")]
        others = [p for p in alive if p not in trackers]
        killed = [p for p in others if _kill(p)]
        psutil.wait_procs(others, timeout=5)
        _, trackers_left = psutil.wait_procs(trackers, timeout=5)
        killed += [p for p in trackers_left if _kill(p)]
        psutil.wait_procs(trackers_left, timeout=2)
        return [f"{p.pid} {self.cmdlines.get(p.pid, '?')}" for p in killed]


def cmdline(proc: psutil.Process) -> str:
    """The process's command line, shortened for reports ('?' once it is gone)."""
    try:
        return shlex.join(proc.cmdline())[:200]
    except psutil.Error:
        return "?"


def kill_session(sid: int, since: float) -> list[str]:
    """SIGKILL the processes of session `sid` (the one a subprocess was started in, with
    start_new_session=True) created since `since`: only what the benchmark started."""
    found, described = [], []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and os.getsid(proc.pid) == sid and proc.create_time() >= since - 1.0:
                if _is_resource_tracker(proc):
                    try:
                        proc.wait(timeout=3)  # it cleans up after the others and exits by itself
                        continue
                    except psutil.TimeoutExpired:
                        pass
                description = f"{proc.pid} {cmdline(proc)}"
                if _kill(proc):
                    described.append(description)
                    found.append(proc)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    psutil.wait_procs(found, timeout=5)
    return described


def remove_left_shm(pids: list[int]) -> list[str]:
    """torch's file_system sharing strategy (Sample Factory uses it) names its shared-memory files
    /dev/shm/torch_<creator pid>_*; processes stopped mid-run leave some behind. Once the whole
    tree is gone nobody can use them: remove them so benchmark runs do not fill /dev/shm."""
    removed = []
    for pid in pids:
        for path in glob.glob(f"/dev/shm/torch_{pid}_*"):
            try:
                os.unlink(path)
                removed.append(os.path.basename(path))
            except OSError:
                pass
    return removed


def send_signal(proc: subprocess.Popen, sig: int) -> None:
    """Signal `proc`, which may have exited already."""
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


class no_interrupts:
    """Defer Ctrl-C/SIGTERM while processes are being killed (a second Ctrl-C must not leave orphans)."""

    def __enter__(self):
        self.saved = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self._defer)
        self.pending: int | None = None
        return self

    def _defer(self, signum, _frame):
        self.pending = signum

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        if self.pending is not None and exc[0] is None:
            if self.pending == signal.SIGINT:
                raise KeyboardInterrupt
            raise Interrupted(signal.Signals(self.pending).name)
        return False


def _kill(proc: psutil.Process) -> bool:
    """SIGKILL a live, non-zombie process; whether it was one."""
    if not _running(proc):
        return False
    try:
        proc.kill()
        return True
    except psutil.Error:
        return False


def _is_resource_tracker(proc: psutil.Process) -> bool:
    try:
        return any("resource_tracker" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
