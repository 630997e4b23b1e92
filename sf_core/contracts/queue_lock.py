"""A faster-fifo queue's lock that a killed process left taken: found, the queue made whole, the lock given back.

faster-fifo guards each queue with a process-shared pthread mutex that is not robust: a process SIGKILLed inside
a put keeps it locked for good, and the next get waits forever (for the runner's own queue: its loop, which a
chaos soak met once in about 90 kills). glibc writes the locking thread's id into the mutex (`__owner`); once no
live thread has that id, nobody will unlock it, and unlocking it for the dead owner lets the waiter go on.

A put writes a message's length, then the message, moving `tail` and `size` after each, and counts the message
(`num_elem`) last, so one cut short can leave bytes that no counted message accounts for: `release_if_owner_died`
drops them first. The one reader of the runner's queue is alive, so its dead holder was a writer.

The offsets are those of faster-fifo 1.5's `Queue` struct on x86-64 glibc, checked on the queue at hand
(`QueueLock.of` returns None where they do not match: nothing is ever written then).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
from typing import Any

# struct Queue: max_size_bytes, max_num_elements, head, tail, size, num_elem (size_t each), the mutex attributes,
# then the pthread_mutex_t (__lock, __count, __owner, __nusers, __kind: ints)
HEAD, TAIL, SIZE, NUM_ELEM = 16, 24, 32, 40
MUTEX = 56
OWNER, KIND = MUTEX + 8, MUTEX + 16
PSHARED_KIND = 0x80
LENGTH = 8  # each message is prefixed by its length, a size_t


class QueueLock:
    """The mutex of one faster-fifo queue, read (and, for a dead owner, released) from another thread."""

    def __init__(self, queue: Any):
        self.queue, self.state = queue, queue.queue_obj_buffer
        self.view = memoryview(self.state).cast("B")
        self.data = memoryview(queue.shared_memory).cast("B")
        self.capacity = queue.max_size_bytes
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

    @classmethod
    def of(cls, queue: Any) -> "QueueLock | None":
        """None for a queue whose layout is not the one this knows (another faster-fifo, another platform)."""
        try:
            lock = cls(queue)
        except (AttributeError, TypeError, ValueError):
            return None
        first = struct.unpack_from("<2Q", lock.view, 0)
        kind = struct.unpack_from("<i", lock.view, KIND)[0]
        if first != (queue.max_size_bytes, queue.maxsize) or not kind & PSHARED_KIND:
            return None
        return lock

    def owner(self) -> int:
        """The thread id holding the lock; 0 if free."""
        locked, _count, owner = struct.unpack_from("<iIi", self.view, MUTEX)
        return owner if locked else 0

    def release_if_owner_died(self) -> int:
        """Unlocks the mutex if the thread holding it is gone, after dropping what a cut-short put left; returns
        that thread's id, or 0 when the lock is free or its holder alive."""
        owner = self.owner()
        if not owner or thread_alive(owner) or self.owner() != owner:
            return 0
        self._drop_uncounted_bytes()
        address = ctypes.c_void_p(ctypes.addressof(self.state) + MUTEX)
        self.libc.pthread_mutex_unlock(address)
        return owner

    def _drop_uncounted_bytes(self) -> None:
        head, _tail, size, count = struct.unpack_from("<4Q", self.view, HEAD)
        counted, position = 0, head
        for _ in range(count):
            length = int.from_bytes(self._read(position, LENGTH), "little")
            if counted + LENGTH + length > size:
                break
            counted += LENGTH + length
            position = (position + LENGTH + length) % self.capacity
        if counted != size:
            struct.pack_into("<2Q", self.view, TAIL, (head + counted) % self.capacity, counted)

    def _read(self, position: int, length: int) -> bytes:
        end = position + length
        if end <= self.capacity:
            return bytes(self.data[position:end])
        return bytes(self.data[position:]) + bytes(self.data[:end - self.capacity])


def process_of(tid: int) -> int:
    """The process (thread group) a thread belongs to; 0 once it is gone."""
    try:
        with open(f"/proc/{tid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Tgid:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration, ValueError):
        return 0


def thread_alive(tid: int) -> bool:
    """Whether a thread of that id runs: /proc/<tid> exists for any thread, and a killed process's stays, as a
    zombie, until its parent reaps it."""
    try:
        with open(f"/proc/{tid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")
