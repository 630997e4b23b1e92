"""Running one trainer subprocess: follow its progress, stop it once the timed window is covered.

The trainer is stopped the way Ctrl-C stops it (SIGINT: it finishes cleanly and writes its final
summary), because a killed trainer reports nothing about how it ended. Its progress comes either from
its console (a line parser: Sample Factory) or from a file it rewrites (a poller: ours).
"""

from __future__ import annotations

import queue
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Callable

from .proctree import Interrupted, TreeMonitor, kill_session, no_interrupts, remove_left_shm, send_signal
from .window import WINDOW_TOLERANCE_SEC, Point

STOP_GRACE_SEC = 30.0  # after SIGINT, how long a trainer may take to shut down before it is killed
# How long past the end of the window a run may go on without covering it before it counts as stalled:
# sized for the coarsest reporter, three of Sample Factory's 5-second status intervals, plus a margin
STALL_SEC = 3 * 5.0 + 30
OUTPUT_OPEN_AFTER_EXIT_SEC = 5.0  # a descendant holding the pipe open after the trainer exited
LINE_WAIT_SEC = 0.25  # the longest the loop sleeps, so a polled report is read this late at most


@dataclass
class Watch:
    """What one trainer subprocess reported and how it ended."""

    command: list[str]
    points: list[Point] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    exit_code: int | None = None
    stopped_by: str = ""
    first_frames_t: float | None = None
    window_covered: bool = False
    wall_launched: float = 0.0  # time.time() at launch
    launch_offset: float | None = None  # launch -> the trainer's clock zero (estimated)
    extra: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    wall_seconds: float = 0.0
    killed: list[str] = field(default_factory=list)
    shm_removed: list[str] = field(default_factory=list)  # shared-memory files its processes left behind


@dataclass(frozen=True)
class Timing:
    """The window (`warmup` seconds after the first frames, then `seconds`) and the start-up bound."""

    warmup: float
    seconds: float
    startup_timeout: float


LineParser = Callable[[str, float, Watch], "Point | None"]  # (line, seconds since launch, watch)
Poller = Callable[[Watch], "Point | None"]  # a new report since the last call, if any


def watch_process(command: list[str], timing: Timing, log_path: str, parse_line: LineParser | None = None,
                  poll: Poller | None = None, cwd: str | None = None, env: dict | None = None,
                  echo: bool = False) -> Watch:
    """Run `command`, collect its reports into points, stop it (SIGINT) once the timed window is covered.

    Every output line goes to `log_path`. Whatever happens (error, timeout, Ctrl-C of the benchmark),
    the process and all its descendants are gone when this returns or raises.
    """
    w = Watch(command=command, wall_launched=time.time())
    launched = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            errors="replace", cwd=cwd, env=env, start_new_session=True)
    monitor = TreeMonitor([proc.pid])
    monitor.start()
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True)
    reader.start()
    try:
        with open(log_path, "w") as log:
            log.write("$ " + shlex.join(command) + "\n")
            _Follower(proc, w, timing, launched, parse_line, poll).follow(lines, log, echo)
    finally:
        try:
            _ask_to_stop(proc)
        finally:
            _clean_up(proc, monitor, reader, w)
            w.wall_seconds = round(time.monotonic() - launched, 2)
    if not w.stopped_by:
        w.stopped_by = "exited by itself"
    return w


class _Follower:
    """The watch loop's state: where the window starts, when SIGINT went out, when the process exited."""

    def __init__(self, proc: subprocess.Popen, w: Watch, timing: Timing, launched: float,
                 parse_line: LineParser | None, poll: Poller | None):
        self.proc, self.w, self.timing, self.launched = proc, w, timing, launched
        self.parse_line, self.poll = parse_line, poll
        self.sigint_at: float | None = None
        self.exited_at: float | None = None
        self.window_start: float | None = None  # the first report at or after the end of the warm-up

    def follow(self, lines: queue.Queue, log: IO[str], echo: bool) -> None:
        while True:
            try:
                read_at, line = lines.get(timeout=LINE_WAIT_SEC)
            except queue.Empty:
                read_at, line = time.monotonic(), ""
            now = time.monotonic() - self.launched
            if line:
                self._on_line(line, read_at - self.launched, now, log, echo)
            if self.poll is not None:
                self._add(self.poll(self.w), now)
            if line is None:  # output closed: the process is exiting
                try:
                    self.proc.wait(timeout=STOP_GRACE_SEC)
                except subprocess.TimeoutExpired:
                    self.w.stopped_by += "; output closed but the process did not exit: killed"
                return
            if self._should_stop_following(now):
                return

    def _on_line(self, line: str, read_t: float, now: float, log: IO[str], echo: bool) -> None:
        log.write(line + "\n")
        self.w.lines.append(line)
        if echo:
            print("    | " + line, flush=True)
        if self.parse_line is not None:
            self._add(self.parse_line(line, read_t, self.w), now)

    def _add(self, point: Point | None, now: float) -> None:
        if point is None:
            return
        w, timing = self.w, self.timing
        w.points.append(point)
        if w.first_frames_t is None and point.frames > 0:
            w.first_frames_t = point.t
        if self.window_start is None and w.first_frames_t is not None and point.t >= w.first_frames_t + timing.warmup:
            self.window_start = point.t
        if (self.window_start is not None and self.sigint_at is None
                and point.t >= self.window_start + timing.seconds - WINDOW_TOLERANCE_SEC):
            w.window_covered = True
            w.stopped_by = "benchmark: SIGINT after the timed window"
            self._interrupt(now)

    def _should_stop_following(self, now: float) -> bool:
        w, timing = self.w, self.timing
        if self.proc.poll() is not None:  # exited, but a descendant may still hold its output open
            self.exited_at = now if self.exited_at is None else self.exited_at
            if now - self.exited_at > OUTPUT_OPEN_AFTER_EXIT_SEC:
                w.stopped_by += "; exited but its output stayed open (a child process outlived it)"
                return True
        if self.sigint_at is None:
            limit = (timing.startup_timeout if w.first_frames_t is None
                     else w.first_frames_t + timing.warmup + timing.seconds + STALL_SEC)
            if now > limit:
                w.stopped_by = (f"benchmark: SIGINT, no frames after {timing.startup_timeout:.0f}s"
                                if w.first_frames_t is None else "benchmark: SIGINT, status reports stopped")
                self._interrupt(now)
        elif now - self.sigint_at > STOP_GRACE_SEC:
            w.stopped_by += f"; killed, still running {STOP_GRACE_SEC:.0f}s after SIGINT"
            return True
        return False

    def _interrupt(self, now: float) -> None:
        self.sigint_at = now
        send_signal(self.proc, signal.SIGINT)


def _reader(stream: IO[str], out: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        out.put((time.monotonic(), line.rstrip("\n")))
    out.put((time.monotonic(), None))


def _ask_to_stop(proc: subprocess.Popen) -> None:
    """The benchmark was interrupted or the run hung: ask it to stop (its Ctrl-C path)."""
    try:
        if proc.poll() is None:
            send_signal(proc, signal.SIGINT)
            proc.wait(timeout=10)  # a second Ctrl-C skips this wait
    except (subprocess.TimeoutExpired, KeyboardInterrupt, Interrupted):
        pass


def _clean_up(proc: subprocess.Popen, monitor: TreeMonitor, reader: threading.Thread, w: Watch) -> None:
    """Kill what is left of the tree, remove its shared-memory files, record how it ended."""
    with no_interrupts():
        monitor.stop()
        # after a clean exit of the trainer, anything still there a few seconds later was left behind
        w.killed = monitor.kill_all(grace=3.0 if proc.poll() is not None else 0.5)
        w.killed += kill_session(proc.pid, w.wall_launched)  # and any orphan the monitor did not see
        w.shm_removed = remove_left_shm(list(monitor.seen))
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        reader.join(timeout=2)
        if proc.stdout:
            proc.stdout.close()
    w.exit_code = proc.returncode
    w.memory = monitor.report()
