"""The sockets a `--workers N` supervisor binds before it starts any worker, and hands to each.

`bind_listener` binds the gateway's `listen` target as uvicorn would for one process (TCP with
SO_REUSEADDR, IPv6 when the host has a colon; a Unix socket replacing a stale socket file, mode 0666),
so every worker accepts on one kernel socket: the kernel queues connections while a worker starts or
restarts, and the same code serves TCP and Unix sockets (SO_REUSEPORT would spread TCP only).
`bind_unix` binds a worker's private Unix socket (`identity.worker_socket`); `Listener` closes a
socket and removes its file.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from calculet.gateway.config import listen_address

BACKLOG = 2048  # uvicorn's default


def bind_listener(listen: str) -> socket.socket:
    """A listening socket for `listen` (`HOST:PORT` or `unix:PATH`, as `config_from` checked it).

    Raises:
        InvalidArgument: `listen` does not parse (`config_from` refuses it first).
        OSError: the address cannot be bound (in use, no such host, no permission).
    """
    address = listen_address(listen)
    if address.uds:
        return bind_unix(Path(address.uds), mode=0o666)
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.host, address.port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def bind_unix(path: Path, mode: int | None = None) -> socket.socket:
    """A listening Unix stream socket at `path`; a socket file already there is replaced (asyncio's
    rule for the one-process gateway), any other file is an error.

    Args:
        path: where.
        mode: the file's mode (None: as the umask makes it).
    Raises:
        OSError: cannot bind (not a socket file in the way, no directory, no permission).
    """
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.stat().st_mode):
            path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        if mode is not None:
            os.chmod(path, mode)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


class Listener:
    """A bound listening socket that removes its own Unix socket file when closed (and only its own:
    a file another process bound there since is left alone).

    Args:
        sock: the socket (owned from now on).
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._path = sock.getsockname() if sock.family == socket.AF_UNIX else ""
        self._inode = os.stat(self._path).st_ino if self._path else 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        """Close the socket; remove its file if it is still the one bound here."""
        self.sock.close()
        if not self._path:
            return
        with contextlib.suppress(OSError):
            if os.stat(self._path).st_ino == self._inode:
                os.unlink(self._path)
