"""systemd's service notification protocol (sd_notify(3)), without libsystemd.

A notification is one datagram of newline-separated `KEY=VALUE` fields sent to the AF_UNIX socket
named by `$NOTIFY_SOCKET`: a path, or a name in the abstract namespace when it starts with '@'.
Without `$NOTIFY_SOCKET` (not started by systemd, or not `Type=notify`) every call does nothing.

A send never blocks (a non-blocking socket and MSG_DONTWAIT), so the watchdog ping can run on the
engine thread under its lock: a socket that is missing, refuses or is full loses that message, the
first such error is logged and later ones are not, and nothing is raised.

What the daemon sends (`daemon/main.py`, `daemon/server/app.py`):

    STATUS=load tiny generation 1: WARMING ...   while the startup models load
    READY=1 + STATUS=serving on ...; models: ... the device is open, startup models Ready, gRPC listens
    STATUS=...                                    whenever serving, draining or a model's state changes
    WATCHDOG=1                                    from the engine thread's loop (`DeviceCore.on_heartbeat`)
    RELOADING=1 ... READY=1                       around a SIGHUP reload of the config file
    STOPPING=1 + STATUS=draining ...              on SIGTERM, before the drain

The gateway sends READY=1 and STOPPING=1 only (`gateway/main.py`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)

SEND_FLAGS = getattr(socket, "MSG_DONTWAIT", 0)  # the socket is non-blocking as well


class Notifier:
    """Sends notifications to `address` (`$NOTIFY_SOCKET` syntax); `Notifier(None)` does nothing.
    `watchdog_s`: how often the owner should call `watchdog` (None: the watchdog is off).

    Thread-safe: any thread may call any method; none blocks or raises.
    """

    def __init__(self, address: str | None, watchdog_s: float | None = None) -> None:
        self.address = address or None
        self.watchdog_s = watchdog_s
        self._target: str | None = None
        self._sock: socket.socket | None = None
        self._warned = False
        self._warn_lock = threading.Lock()  # guards `_warned` only, never held across a send
        if self.address is None:
            return
        if self.address.startswith("@"):
            self._target = "\0" + self.address[1:]  # Linux abstract namespace
        elif self.address.startswith("/"):
            self._target = self.address
        else:  # e.g. systemd 254's vsock: addresses
            self._warn(f"unsupported NOTIFY_SOCKET {self.address!r}: notifications are off")
            return
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # close-on-exec (PEP 446)
            sock.setblocking(False)
        except OSError as exc:
            self._warn(f"cannot create the notify socket: {exc}; notifications are off")
            self._target = None
            return
        self._sock = sock

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Notifier:
        """The notifier of `$NOTIFY_SOCKET` (none when unset or empty), with the watchdog interval of
        `watchdog_interval`."""
        return cls(environ.get("NOTIFY_SOCKET"), watchdog_interval(environ))

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, *fields: str) -> bool:
        """Send `fields` (each `KEY=VALUE`, no newline) as one notification. Returns whether it was sent."""
        if self._sock is None or self._target is None or not fields:
            return False
        try:
            self._sock.sendto("\n".join(fields).encode("utf-8", "replace"), SEND_FLAGS, self._target)
        except OSError as exc:
            self._warn(f"sd_notify to {self.address} failed: {exc}; further failures are not logged")
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *_status(status))

    def status(self, text: str) -> bool:
        return self.notify(*_status(text))

    def reloading(self, status: str = "") -> bool:
        """RELOADING=1 with the MONOTONIC_USEC systemd asks of it (Type=notify-reload)."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *_status(status))

    def stopping(self, status: str = "") -> bool:
        return self.notify("STOPPING=1", *_status(status))

    def watchdog(self) -> None:
        """WATCHDOG=1 (a heartbeat listener: returns None)."""
        self.notify("WATCHDOG=1")

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _warn(self, message: str) -> None:
        with self._warn_lock:
            first, self._warned = not self._warned, True
        if first:
            log.warning("%s", message)


def _status(text: str) -> tuple[str, ...]:
    """A STATUS= field for `text` (one line), or none for an empty text."""
    line = " ".join(text.split())
    return (f"STATUS={line}",) if line else ()


def watchdog_interval(environ: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """How often to send WATCHDOG=1, in seconds: half of the unit's WatchdogSec= (`$WATCHDOG_USEC`);
    None when the watchdog is off, or `$WATCHDOG_PID` names another process (the value was inherited)."""
    owner = environ.get("WATCHDOG_PID", "")
    if owner and owner != str(os.getpid() if pid is None else pid):
        return None
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None
