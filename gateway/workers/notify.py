"""`NotifyReceiver`: the supervisor's own `$NOTIFY_SOCKET` for its workers.

Each worker is the ordinary one-process gateway, which tells systemd READY=1 once it listens and
STOPPING=1 when it stops (`sd_notify.Notifier`, `main.NotifyingServer`). The supervisor starts its
workers with `$NOTIFY_SOCKET` naming this datagram socket instead, so the same messages come here,
each with the sender's pid (SO_PASSCRED, as systemd reads them); the supervisor tells systemd READY=1
itself once every worker is ready (the unit keeps `NotifyAccess=main`).

Data flow: the event loop's reader callback drains the socket (non-blocking) and calls the handler
with (pid, fields) for each datagram.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("calculet.gateway.workers")

CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid
MAX_DATAGRAM = 4096

Handler = Callable[[int, list[str]], None]


class NotifyReceiver:
    """A bound datagram socket at `path` receiving sd_notify messages.

    Args:
        path: where to bind (in the supervisor's private run directory).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.bind(str(path))
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handler: Handler | None = None

    @property
    def address(self) -> str:
        """The `$NOTIFY_SOCKET` value naming this socket."""
        return str(self.path)

    def attach(self, loop: asyncio.AbstractEventLoop, handler: Handler) -> None:
        """Call `handler(pid, fields)` on `loop` for every message from now on."""
        self._loop, self._handler = loop, handler
        loop.add_reader(self._sock.fileno(), self._drain)

    def close(self) -> None:
        """Stop reading (if attached) and close the socket."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.fileno())
        self._loop = None
        self._sock.close()

    def _drain(self) -> None:
        while True:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(MAX_DATAGRAM, socket.CMSG_SPACE(CREDENTIALS.size))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.warning("worker notifications: %s", err)
                return
            pid = 0
            for level, kind, cred in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = CREDENTIALS.unpack(cred[: CREDENTIALS.size])[0]
            if self._handler is not None:
                self._handler(pid, data.decode("utf-8", "replace").split("\n"))
