"""What every component shares: a name, guarded slots, error reporting, process plumbing.

signal-slot-mp logs an exception raised in a slot and lets it kill the event loop. Here every slot
is wrapped (`@guarded`) so the exception becomes a `ComponentError` carrying the component's name and
the original traceback (for an env that broke its contract, only its one line); the process that hosts
the loop sends it to the runner (signal `component_error`), which stops training with that message
instead of waiting for a timeout.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import pickle
import signal as os_signal
import threading
import time
import traceback
from queue import Empty, Full
from typing import Any, Callable, cast

import faster_fifo
import torch
from sf_core.common.allocator import reuse_freed_memory  # noqa: F401  (re-exported: what component processes do)
from sf_core.common.logs import quiet_signal_slot_logs, setup_logging
from sf_core.common.parent_death import die_with_parent
from sf_core.common.process_name import name_process
from sf_core.envs.env_check import EnvContractError
from sf_core.contracts.control import ControlBlock
from sf_core.contracts.polling_queue import PollingQueue
from sf_core.contracts.signals import COMPONENT_ERROR, REPORT, RoutedSignal, Signal
from sf_core.contracts.timing import PhaseClock
from signal_slot.signal_slot import EventLoop, EventLoopObject, EventLoopProcess, Timer


SIGNAL_QUEUE_BYTES = 5_000_000

log = logging.getLogger("sf_core")


class ComponentError(RuntimeError):
    def __init__(self, component: str, details: str):
        super().__init__(f"{component} failed:\n{details}")
        self.component, self.details = component, details

    def __reduce__(self):
        return ComponentError, (self.component, self.details)


def guarded(slot: Callable) -> Callable:
    """Turn any exception escaping a slot into a ComponentError naming the component; count the slot's time
    as the component's busy time (sf_core/contracts/timing.py)."""

    @functools.wraps(slot)
    def wrapper(self: "Component", *args: Any):
        clock = self.clock
        clock.depth += 1
        started = time.perf_counter()
        try:
            return slot(self, *args)
        except ComponentError:
            raise
        except Exception as exc:
            raise ComponentError(self.name, _describe(exc)) from exc
        finally:
            clock.depth -= 1
            if clock.depth == 0:
                clock.busy += time.perf_counter() - started

    return wrapper


def _describe(exc: BaseException) -> str:
    """The error as the runner prints it: its traceback, or only its one line for an env that broke its contract
    (the traceback would point into sf_core's buffers, not at the env; it goes to the debug log)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    if isinstance(exc, EnvContractError):
        log.debug("%s", text)
        return str(exc)
    return text


class Component(EventLoopObject):
    """An event-loop object with a readable name that emits the signals of `sf_core.contracts.signals`.

    Signals are emitted by name (the `Signal` objects do it), never through signal-slot's class-level
    `@signal` descriptor, which two threads emitting the same signal could race on.
    """

    HEARTBEAT_SEC = 0.5
    TIMING_SEC = 1.0  # how often a component that reports its timing does (`report_timing`)

    def __init__(self, event_loop: EventLoop, name: str, control: ControlBlock | None = None):
        super().__init__(event_loop, name)
        self.name = name
        self.clock = PhaseClock(name)
        self.reports_timing = False  # set by report_timing()
        self.heartbeats = control.heartbeats if control is not None else None
        self.heartbeat_index = self.heartbeats.index(name) if self.heartbeats is not None else -1
        if self.heartbeats is not None:
            self.heartbeat_timer = Timer(event_loop, self.HEARTBEAT_SEC, object_id=f"{name}_heartbeat")
            self.heartbeat_timer.timeout.connect(self.idle_heartbeat)

    def beat(self, activity: str) -> None:
        if self.heartbeats is not None:
            self.heartbeats.beat(self.heartbeat_index, activity)

    def report_timing(self) -> None:
        """From the loop's start on, send where this component's time went (a `TimingReport`) every TIMING_SEC,
        and once more when `stop_loop` ends it. The loop's start then reaches the component's `on_start` from here:
        signal-slot keeps one slot per signal and receiver."""
        self.reports_timing = True
        self.timing_timer = Timer(self.event_loop, self.TIMING_SEC, object_id=f"{self.name}_timing_timer")
        self.timing_timer.timeout.connect(self.send_timing)
        self.event_loop.start.connect(self.timing_started)  # one slot per signal and receiver: on_start runs here

    def timing_started(self) -> None:
        self.clock.mark_started()
        on_start = getattr(self, "on_start", None)
        if on_start is not None:
            started = time.perf_counter()
            on_start()
            self.clock.add("start_up", time.perf_counter() - started)

    def send_timing(self) -> None:
        REPORT.emit(self, self.clock.take())

    def idle_heartbeat(self) -> None:
        # a timer fires only between slots, so the component is idle right now
        self.beat("waiting for signals")

    def report_error(self, error: BaseException) -> None:
        details = error.details if isinstance(error, ComponentError) else _describe(error)
        component = error.component if isinstance(error, ComponentError) else self.name
        COMPONENT_ERROR.emit(self, component, details)

    def stop_loop(self) -> None:
        self.beat("stopped")
        if self.reports_timing:
            self.send_timing()
        self.event_loop.stop()


class Routing:
    """The one place that reads or edits signal-slot-mp's internals: its routing tables (which receivers
    a signal goes to, through which queue) and its loops' queues. Everything else uses the library's
    public API through `sf_core.contracts.signals`."""

    @staticmethod
    def use_plain_pickle(loop: EventLoop) -> EventLoop:
        """Give a loop a faster-fifo queue that pickles with plain `pickle` instead of ForkingPickler.

        Signal payloads here are ints, lists, strings and small dataclasses (never tensors or handles),
        and plain pickle is several times cheaper per message, which adds up at one signal per split
        step. Must run before any connection to the loop is made (connections capture the queue).
        The loop's own faster-fifo queue is kept and told to pickle plainly: a new one would allocate and
        zero another SIGNAL_QUEUE_BYTES of shared memory per loop while the run starts.
        """
        old = loop.signal_queue
        if isinstance(old, faster_fifo.Queue) and old.max_size_bytes >= SIGNAL_QUEUE_BYTES:
            old.dumps = pickle.dumps  # what faster-fifo's `dumps=` argument sets; pickled with the queue
            return loop
        Routing._swap_queue(loop, faster_fifo.Queue(max_size_bytes=SIGNAL_QUEUE_BYTES, dumps=pickle.dumps))
        return loop

    @staticmethod
    def queue_of(loop: EventLoop) -> Any:
        """The faster-fifo queue a loop reads (sf_core/contracts/loop_watchdog.py looks at its lock)."""
        return _faster_fifo(loop.signal_queue)

    @staticmethod
    def _swap_queue(loop: EventLoop, new: Any) -> None:
        """The loop reads `new`, and its objects' connections to each other put into it (one put per signal: a
        sender's distinct queues each get the message)."""
        old, loop.signal_queue = loop.signal_queue, new
        for obj in list(loop.objects.values()):  # the loop's own connections (its terminate signal)
            for receiver, queue in obj.receiver_queues.items():
                if queue is old:
                    obj.receiver_queues[receiver] = new

    @staticmethod
    def emit_bounded(sender: EventLoopObject, signal_: Signal, args: tuple, timeout: float = 2.0,
                     route: int | None = None) -> list[str]:
        """Emit like `signal_.emit`, but give up on any receiver's queue that stays locked past `timeout`.

        A process killed inside a faster-fifo put or get leaves that queue's mutex locked for good
        (the mutexes are not robust), so an ordinary emit into it blocks forever. Each queue gets its
        own daemon thread (puts release the GIL); a put still stuck at the deadline is abandoned.
        Returns the receivers that could not be reached. `route`: the index a RoutedSignal is sent to.
        """
        name = signal_.route(route) if isinstance(signal_, RoutedSignal) and route is not None else signal_.name
        by_queue: dict[int, tuple[Any, list[str]]] = {}
        for receiver in sender.send_signals_to.get(name, ()):
            queue = sender.receiver_queues[receiver]
            by_queue.setdefault(id(queue), (queue, []))[1].append(receiver)
        message = [(sender.object_id, name, args)]
        puts = []
        for queue, receivers in by_queue.values():
            thread = threading.Thread(target=_put_quietly, args=(queue, message), daemon=True,
                                      name=f"{sender.object_id}_emit_{name}")
            thread.start()
            puts.append((thread, receivers))
        deadline = time.monotonic() + timeout
        unreachable = []
        for thread, receivers in puts:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                unreachable += receivers
        return unreachable

    @staticmethod
    def locked_queues(sender: EventLoopObject, timeout: float = 1.0) -> list[str]:
        """The receivers of `sender` (the components of a dead process) whose queue a put cannot enter within
        `timeout`: its process may have died inside a put or get, holding the lock for good (see `emit_bounded`).
        Each queue gets one message no receiver is connected to, which its loop discards; the sender's own loop's
        queue is emptied first (what was sent to the dead process is stale)."""
        own = sender.event_loop.signal_queue
        by_queue: dict[int, tuple[Any, list[str]]] = {id(own): (own, [sender.object_id])}
        for receiver, queue in sender.receiver_queues.items():
            by_queue.setdefault(id(queue), (queue, []))[1].append(receiver)
        probes = []
        for queue, receivers in by_queue.values():
            args = (queue, [(sender.object_id, "queue_probe", ())], queue is own)
            probes.append((threading.Thread(target=_probe, args=args, daemon=True, name="queue_probe"), receivers))
            probes[-1][0].start()
        deadline = time.monotonic() + timeout
        for thread, _ in probes:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sorted({r for thread, receivers in probes if thread.is_alive() for r in receivers})

    @staticmethod
    def poll_only(loop: EventLoop) -> None:
        """Read the loop's queue without ever waiting on it (`PollingQueue`): for a process that takes over the
        queue of one that died, maybe while waiting on it."""
        if not isinstance(loop.signal_queue, PollingQueue):
            Routing._swap_queue(loop, PollingQueue(loop.signal_queue))

    @staticmethod
    def restart_timers(loop: EventLoop) -> None:
        """Count every timer of the loop from now: in a process started long after the loop was built (a
        replacement), each would otherwise fire once per interval missed since."""
        for timer in list(loop.timers):
            timer.start()

    @staticmethod
    def queue_to(sender: EventLoopObject, receiver_id: str) -> Any:
        """The faster-fifo queue `sender`'s signals to `receiver_id` go into (None if it sends it none)."""
        return _faster_fifo(sender.receiver_queues.get(receiver_id))

    @staticmethod
    def forget_receivers(sender: EventLoopObject, receiver_ids: list[str]) -> None:
        """Stop routing `sender`'s signals to these receivers (dead processes). signal-slot's disconnect()
        refuses objects of another process once started; the sender's own tables are all an emit reads."""
        for receiver_id in receiver_ids:
            for receivers in sender.send_signals_to.values():
                receivers.discard(receiver_id)
            sender.receiver_queues.pop(receiver_id, None)
            sender.receiver_refcount.pop(receiver_id, None)

    @staticmethod
    def forget_all(sender: EventLoopObject) -> None:
        """Drop every connection `sender` made (before it is wired again to new components)."""
        for table in (sender.send_signals_to, sender.receiver_queues, sender.receiver_refcount):
            table.clear()

    @staticmethod
    def drain(loop: EventLoop) -> None:
        """Discard every signal waiting in the loop's queue (sent by components that are gone)."""
        while True:
            try:
                loop.signal_queue.get_many(block=False)
            except Empty:
                return

    @staticmethod
    def rearm(loop: EventLoop) -> None:
        """Let a loop that was told to stop run again (exec or process_events)."""
        loop.should_terminate = False


def _put_quietly(queue: Any, message: list) -> None:
    try:
        queue.put_many(message, block=False)
    except Full:
        logging.getLogger(__name__).warning("a signal queue is full: dropped %s", message[0][1])


def _probe(queue: Any, message: list, drain: bool) -> None:
    """A put into `queue` (its lock, and its condition variable's signal); first, with `drain`, a get of all."""
    with contextlib.suppress(Empty):
        while drain:
            queue.get_many(block=False)
    _put_quietly(queue, message)


def configure_process(torch_threads: int) -> None:
    """In a component process: leave Ctrl-C and SIGTERM to the runner, keep torch to its thread budget.

    A terminal's Ctrl-C, `kill` of a process group, or a service manager signals every process at
    once; a component killed mid-operation can die holding a faster-fifo queue lock (those mutexes
    are not robust) and hang whoever touches that queue next. So components ignore both signals: the
    runner stops them in order, and their parent watchdog ends them if the runner is gone.
    """
    os_signal.signal(os_signal.SIGINT, os_signal.SIG_IGN)
    os_signal.signal(os_signal.SIGTERM, os_signal.SIG_IGN)
    die_with_parent()
    setup_logging()  # a spawned process (and every process of a sampler on a cluster node) starts without it
    torch.set_num_threads(torch_threads)
    reuse_freed_memory()
    quiet_signal_slot_logs()


class ComponentProcess(EventLoopProcess):
    """EventLoopProcess that reports a crash of its loop to the runner and watches its parent."""

    def __init__(self, name: str, mp_context, torch_threads: int):
        super().__init__(name, multiprocessing_context=mp_context, daemon=True)
        Routing.use_plain_pickle(self.event_loop)
        self.torch_threads = torch_threads
        self.reporter: Component | None = None  # the component whose name a crash is reported under
        self.threads: list[tuple[EventLoop, Component]] = []  # extra loops run on threads (the batcher)
        self.death_hint = ""  # what the runner adds when this process dies: its likely cause

    def renew(self) -> None:
        """Make this process startable again after its OS process died (sf_core/run/worker_replacement.py): a new
        one of the same start method runs the components as they were built (this copy never ran them), on the
        same signal queue, so every connection to them still holds."""
        old = cast(Any, self)._process  # signal-slot's wrapped multiprocessing process
        self._process = type(old)(target=self._target, name=old.name, daemon=old.daemon)
        with contextlib.suppress(ValueError):  # a process not yet reaped cannot be closed; its handle then waits
            old.close()

    def _target(self) -> None:
        configure_process(self.torch_threads)
        name_process(self.name)
        Routing.restart_timers(self.event_loop)
        ParentWatchdog(self.event_loop, f"{self.name}_parent_watchdog")  # the loop keeps it (loop.objects)
        threads = [threading.Thread(target=run_loop, args=(loop, comp), name=comp.name, daemon=True)
                   for loop, comp in self.threads]
        ThreadStarter(self.event_loop, f"{self.name}_thread_starter", threads)
        run_loop(self.event_loop, self.reporter)
        for t in threads:
            if t.ident is not None:  # started: the loop may have died before its start signal
                t.join(timeout=5.0)
        gc.freeze()  # a spawned process exits through the interpreter's teardown: see cli.exit_process


class ThreadStarter(EventLoopObject):
    """Starts a process's extra loops (the batcher) from the main loop's `start` signal, not before.

    A signal a thread emits to the main loop's component must queue behind that `start`, or the
    component handles it before its `on_start` ran: the learner got `batch_ready` before building its
    model (KeyError 'actor_critic'), seen under spawn on a loaded machine, where the learner process's
    main thread reached `exec` only after the batcher had filled a dataset."""

    def __init__(self, loop: EventLoop, name: str, threads: list[threading.Thread]):
        super().__init__(loop, name)
        self.threads = threads
        loop.start.connect(self.start_threads)

    def start_threads(self) -> None:
        for t in self.threads:
            t.start()


class ParentWatchdog(EventLoopObject):
    """Exits the process if the runner died (even kill -9), so no worker is ever orphaned."""

    def __init__(self, loop: EventLoop, name: str):
        super().__init__(loop, name)
        self.parent = os.getppid()
        self.timer = Timer(loop, 1.0, object_id=f"{name}_timer")
        self.timer.timeout.connect(self.check)

    def check(self) -> None:
        if os.getppid() != self.parent:
            os._exit(3)


def run_loop(loop: EventLoop, reporter: Component | None) -> None:
    try:
        loop.exec()
    except BaseException as exc:  # noqa: BLE001 - anything that kills the loop goes to the runner
        if reporter is not None:
            reporter.report_error(exc)
        raise SystemExit(1)


def _faster_fifo(queue: Any) -> Any:
    """The faster-fifo queue itself, where a PollingQueue wraps it."""
    return queue.queue if isinstance(queue, PollingQueue) else queue
