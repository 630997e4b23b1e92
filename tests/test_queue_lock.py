"""A queue lock a killed process left taken is given back, and what its cut-short put wrote is dropped
(sf_core/contracts/queue_lock.py); a lock a live thread holds is left alone."""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import multiprocessing.connection
import os
import signal
import struct
import threading

import faster_fifo
import pytest

from sf_core.contracts.queue_lock import MUTEX, SIZE, TAIL, QueueLock, thread_alive

LIBC = ctypes.CDLL(ctypes.util.find_library("c"))


def _mutex(queue) -> ctypes.c_void_p:
    return ctypes.c_void_p(ctypes.addressof(queue.queue_obj_buffer) + MUTEX)


def _die_inside_a_put(queue) -> None:
    """What a process SIGKILLed inside a put leaves: the lock taken, a message's length written, no message."""
    LIBC.pthread_mutex_lock(_mutex(queue))
    view = memoryview(queue.queue_obj_buffer).cast("B")
    tail, size = struct.unpack_from("<2Q", view, TAIL)
    data = memoryview(queue.shared_memory).cast("B")
    data[tail:tail + 8] = (1000).to_bytes(8, "little")
    struct.pack_into("<2Q", view, TAIL, tail + 8, size + 8)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.timeout(30)
def test_a_lock_left_by_a_killed_put_is_given_back_and_the_queue_reads_whole():
    queue = faster_fifo.Queue(max_size_bytes=10_000)
    queue.put("before")
    child = multiprocessing.get_context("fork").Process(target=_die_inside_a_put, args=(queue,))
    child.start()
    # dead, not reaped: a zombie, as a process the stuck runner could not reap yet
    assert multiprocessing.connection.wait([child.sentinel], 10)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(queue.get(timeout=20)), daemon=True)
    reader.start()  # waits for the lock, as the runner's loop would
    reader.join(0.3)
    assert reader.is_alive() and not got
    lock = QueueLock.of(queue)
    assert lock is not None and lock.owner() == child.pid and not thread_alive(child.pid)
    assert lock.release_if_owner_died() == child.pid
    reader.join(5)
    assert got == ["before"]  # the length without its message was dropped
    queue.put("after")
    assert queue.get(timeout=5) == "after" and queue.qsize() == 0
    child.join(10)
    assert child.exitcode == -signal.SIGKILL


@pytest.mark.timeout(30)
def test_a_lock_a_live_thread_holds_is_left_alone():
    queue = faster_fifo.Queue(max_size_bytes=10_000)
    lock = QueueLock.of(queue)
    assert lock is not None and lock.owner() == 0 and lock.release_if_owner_died() == 0
    assert LIBC.pthread_mutex_trylock(_mutex(queue)) == 0
    try:
        assert lock.owner() == threading.get_native_id() and lock.release_if_owner_died() == 0
        assert LIBC.pthread_mutex_trylock(_mutex(queue)) != 0  # still held
    finally:
        LIBC.pthread_mutex_unlock(_mutex(queue))
    assert lock.owner() == 0


def test_a_queue_of_another_layout_is_not_touched():
    class Other:
        queue_obj_buffer = (ctypes.c_ubyte * 128)()
        shared_memory = (ctypes.c_ubyte * 64)()
        max_size_bytes, maxsize = 64, 7

    assert QueueLock.of(Other()) is None
