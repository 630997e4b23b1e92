"""Env service addresses: an endpoint (`HOST:PORT*N`, a server with N slots) and one slot of it, parsed from
a flag value or a YAML entry. Every file that lists servers (an --env_service value, a `pools:` file, a fleet
file) spells its addresses this way."""

from __future__ import annotations

from dataclasses import dataclass


class ServiceConfigError(ValueError):
    """An --env_service value that cannot work; the message says why, with the arithmetic."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    capacity: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.address}*{self.capacity}"


@dataclass(frozen=True)
class SlotAddress:
    """One env instance: instance `index` (0 ≤ index < capacity) of the server at host:port."""

    host: str
    port: int
    index: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}#{self.index}"


def parse_item(text: str, where: str) -> Endpoint:
    """`host:port*capacity`; `where` starts the message of a ServiceConfigError."""
    item = text.strip()
    address, star, capacity_text = item.partition("*")
    if not star:
        raise ServiceConfigError(f"{where}: {item!r} has no capacity; write host:port*capacity, e.g. 127.0.0.1:5555*4")
    host, colon, port_text = address.rpartition(":")
    if not colon or not host:
        raise ServiceConfigError(f"{where}: {item!r} has no host:port before '*'")
    try:
        port, capacity = int(port_text), int(capacity_text)
    except ValueError:
        raise ServiceConfigError(f"{where}: {item!r}: port and capacity must be integers") from None
    return endpoint(host, port, capacity, where)


def endpoint(host: str, port: int, capacity: int, where: str) -> Endpoint:
    if not 0 < port < 65536:
        raise ServiceConfigError(f"{where}: port {port} is not in 1..65535")
    if capacity < 1:
        raise ServiceConfigError(f"{where}: capacity of {host}:{port} must be at least 1, got {capacity}")
    return Endpoint(host, port, capacity)


def yaml_item(item, where: str) -> Endpoint:
    """One YAML entry: 'host:port*capacity' or {host, port, capacity}."""
    if isinstance(item, str):
        return parse_item(item, where)
    if isinstance(item, dict) and {"host", "port", "capacity"} <= set(item):
        try:
            return endpoint(str(item["host"]), int(item["port"]), int(item["capacity"]), where)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ServiceConfigError):
                raise
            raise ServiceConfigError(f"{where}: port and capacity must be integers") from None
    raise ServiceConfigError(f"{where}: expected 'host:port*capacity' or {{host, port, capacity}}, got {item!r}")
