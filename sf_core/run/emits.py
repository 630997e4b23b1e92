"""The runner's emits: never held up by the queue of a process that died.

A component killed inside a faster-fifo put or get leaves that queue's mutex locked for good (see
Routing.emit_bounded); an emit into it would block the runner's loop forever. The runner gives up on such a
receiver after a timeout, says so, and Topology.stop_processes kills it instead.
"""

from __future__ import annotations

import logging

from sf_core.contracts.component import Routing
from sf_core.contracts.signals import RoutedSignal, Signal
from signal_slot.signal_slot import EventLoopObject

log = logging.getLogger("sf_core")


def emit(sender: EventLoopObject, signal_: Signal, args: tuple, route: int | None, serial: bool,
         timeout: float) -> list[str]:
    """Returns the receivers whose queue stayed locked (their loop is stuck for good). `route`: the policy a routed
    signal is for. `serial`: one process, where nothing can die holding a lock."""
    if serial:
        if isinstance(signal_, RoutedSignal) and route is not None:
            signal_.emit_to(sender, route, *args)
        else:
            signal_.emit(sender, *args)
        return []
    unreachable = Routing.emit_bounded(sender, signal_, args, timeout=timeout, route=route)
    if unreachable:
        log.warning("could not deliver '%s' to %s: a dead process left its queue locked",
                    signal_.name, ", ".join(sorted(unreachable)))
    return unreachable
