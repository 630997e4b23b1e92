"""One slot of an env pool (an instance of an env server, `host:port#index`) and the states it goes through
(sf_core/service/env_pool.py draws the diagram); the errors of a pool's callers."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from sf_core.service.remote_env import RemoteEnv, ServiceError


class SlotState(str, Enum):
    IDLE = "idle"
    BUSY = "busy"
    ERROR = "error"
    STOPPED = "stopped"
    JOINING = "joining"  # added: checked by the background thread before it is handed out
    DRAINING = "draining"  # busy and drained: leaves the pool when its holder gives it back


class PoolTimeout(ServiceError):
    """No healthy slot became free within the acquire timeout."""


class SlotLost(ServiceError):
    """The slot an env was running on failed: the episode in progress is gone."""


@dataclass(eq=False)
class Slot:
    address: str  # host:port
    index: int  # instance index on that server
    state: SlotState = SlotState.IDLE
    env: RemoteEnv | None = None  # the connection, opened on first use
    failures: int = 0
    readmissions: int = 0
    last_error: str = ""
    next_check: float = 0.0
    checking: bool = False
    suspect: bool = False  # its server timed out on another slot: fail fast instead of waiting again
    uses: int = field(default=0)
    in_flight: int = 0  # requests sent to it and not yet answered (sf_core/service/slot_choice.py)

    @property
    def name(self) -> str:
        return f"{self.address}#{self.index}"
