"""User code that worker processes run: env factories, model parts and algorithms registered from Python.

Under the `spawn` start method a worker process gets everything it runs by unpickling it. Plain pickle
sends a function as "module and name", which fails for a lambda or a closure (no name to look up)
and, in the worker, for a function defined in a notebook or in `python -c` (the worker cannot import
that `__main__`). So every registry wraps what it is given in `UserCode`, which pickles with
cloudpickle: by reference what an importable module defines (as plain pickle would), by value the
rest (the function's code, its closure and the globals it uses, classes included), rebuilt in the
worker. Under fork and in serial mode nothing is pickled; the wrapper only forwards the call.
"""

from __future__ import annotations

from typing import Any, Callable

import cloudpickle


class UnsendableError(ValueError):
    """User code that cannot reach worker processes, not even by value; the message names it."""


class UserCode:
    """A registered callable that pickles by value where plain pickle cannot send it."""

    def __init__(self, fn: Callable, what: str):
        if not callable(fn):
            raise TypeError(f"{what} must be callable, got {type(fn).__name__}")
        self.fn, self.what = fn, what

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple:
        return _rebuild, (self.payload(), self.what)

    def payload(self) -> bytes:
        """The pickled callable; raises UnsendableError naming it when even cloudpickle cannot."""
        try:
            return cloudpickle.dumps(self.fn)
        except Exception as exc:
            raise UnsendableError(
                f"{self.what} cannot be sent to worker processes ({type(exc).__name__}: {exc}): it, or something "
                f"it refers to (an open file, a lock, a socket, a live env), cannot be pickled even by value; "
                f"create such objects inside the function, or train with --serial_mode=True"
            ) from None

    def check(self) -> None:
        """Fail now, with the message naming this callable, rather than in a starting worker."""
        self.payload()

    def __repr__(self) -> str:
        return f"UserCode({self.fn!r}, {self.what!r})"


def user_code(fn: Callable, what: str) -> UserCode:
    """`fn` wrapped for the worker processes (once: a registry copying another keeps the wrapper)."""
    return fn if isinstance(fn, UserCode) else UserCode(fn, what)


def _rebuild(payload: bytes, what: str) -> UserCode:
    return UserCode(cloudpickle.loads(payload), what)
