"""Where a learner group's ranks meet: the loopback on one machine, or this machine's address towards the
others on a cluster, and the network interface gloo and NCCL bind there."""

from __future__ import annotations

import socket
import sys

ADDRESS = "127.0.0.1"  # one machine: the ranks meet on the loopback interface
LOOPBACK_INTERFACE = "lo0" if sys.platform == "darwin" else "lo"


def free_port(address: str = ADDRESS) -> int:
    """A port nothing listens on now, on `address`, for rank 0's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def address_towards(host: str) -> str:
    """This machine's address on the route to `host` (a UDP socket's connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


def interface_towards(host: str) -> str:
    """The network interface this machine reaches `host` through: gloo and NCCL bind it (by name)."""
    own = address_towards(host)
    if own.startswith("127."):
        return LOOPBACK_INTERFACE
    import psutil  # with the ray extra: only a cluster's ranks meet on an address that is not loopback

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == own for a in addresses):
            return name
    raise RuntimeError(f"learner group: no network interface of this machine has {own}, its address towards {host}")
