"""Open/closed lifecycle of a client object (its channel), shared by the sync and async clients.

The client owns its channel from construction until `close()`; after that every call is refused
with `FailedPrecondition` instead of surfacing gRPC's "closed channel" ValueError. Closing twice
is a no-op (context manager exit after an explicit close).
"""

from __future__ import annotations

import threading
from enum import Enum

from calculet.common.errors import FailedPrecondition
from calculet.common.lifecycle import Lifecycle, table


class ClientState(Enum):
    OPEN = "open"
    CLOSED = "closed"


CLIENT_TRANSITIONS = table([(ClientState.OPEN, [ClientState.CLOSED])])


class ClientLife:
    """Thread-safe open/closed state of one client.

    Args:
        name: for messages, e.g. "client of unix:run/board0.sock".
    """

    def __init__(self, name: str) -> None:
        self._life = Lifecycle(name, ClientState.OPEN, CLIENT_TRANSITIONS)
        self._lock = threading.Lock()

    @property
    def state(self) -> ClientState:
        return self._life.state

    def check_open(self) -> None:
        """Raises: FailedPrecondition: the client was closed."""
        if self._life.state is ClientState.CLOSED:
            raise FailedPrecondition(f"{self._life.name} is closed")

    def close(self) -> bool:
        """Mark closed; True if this call closed it (the caller then releases the channel)."""
        with self._lock:
            if self._life.state is ClientState.CLOSED:
                return False
            self._life.move(ClientState.CLOSED)
            return True
