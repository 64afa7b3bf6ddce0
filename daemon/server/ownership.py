"""One owner per board and per Unix socket (issue 9).

Board: `BoardLock.acquire(runtime_dir, board)` takes an exclusive, non-blocking `flock` on
`<runtime_dir>/calculet-board<N>.lock` before the device is opened, writes the holder's pid into it for
operators, and keeps it for the life of the process. The kernel drops the lock when the process dies,
so a killed daemon never leaves a stale lock; the file itself is never removed (removing it would let
a second daemon lock a fresh inode while the first still holds the old one). The lock itself is
`calculet.daemon.pid_lock`'s, as calsim's device lock is.

Socket: a path is replaced only when nothing listens on it. `probe_socket` connects to decide:
a connect that succeeds (or a full backlog) is a live daemon, ECONNREFUSED is a socket left by a
killed one. `bind_unix` claims and binds under a `flock` on the socket's directory (two daemons
starting at once cannot both take a stale path), binds grpc at a private name and hard-links it to
the public path (`link` fails if anything appeared there meanwhile), and records the inode.
`remove_own_socket` unlinks the public path at shutdown only if it is still that inode. grpc unlinks
the path it bound when the server stops, whatever is there by then: binding at the private name keeps
that unlink away from the public path, which may belong to another daemon by then.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import logging
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from calculet.common.errors import CalculetError, ErrorKind, InvalidArgument
from calculet.daemon.pid_lock import holder, lock_pid_file, make_dir, unlock_pid_file

log = logging.getLogger(__name__)

SOCKET_MODE = 0o660
PROBE_TIMEOUT_S = 2.0  # a live listener accepts into its backlog at once; this only bounds a wedged one
DIR_LOCK_WAIT_S = 10.0  # another daemon holds the socket directory's lock for a bind (milliseconds)


class BoardBusy(CalculetError):
    """Another live process holds this board's lock."""

    kind = ErrorKind.FAILED_PRECONDITION

    def __init__(self, board: int, path: Path, pid: int | None) -> None:
        super().__init__(f"board {board} is already served by {holder(pid)} (lock {path})")
        self.board = board
        self.path = path
        self.pid = pid


class SocketInUse(CalculetError):
    """A live process listens on the Unix socket path the daemon was told to serve on."""

    kind = ErrorKind.FAILED_PRECONDITION


def lock_path(runtime_dir: Path, board: int) -> Path:
    return runtime_dir / f"calculet-board{board}.lock"


def ensure_runtime_dir(runtime_dir: Path) -> None:
    """Create `runtime_dir` (mode 0o750) if it is missing.

    Raises:
        InvalidArgument: it cannot be created, or is not a directory.
    """
    make_dir(runtime_dir, "runtime_dir", InvalidArgument)


class BoardLock:
    """The exclusive lock on one board, held until `release` or the end of the process."""

    def __init__(self, board: int, path: Path, fd: int) -> None:
        self.board = board
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, runtime_dir: Path, board: int) -> BoardLock:
        """Take board `board`'s lock in `runtime_dir` (created if missing) without waiting.

        Raises:
            BoardBusy: another live process holds it (the message names its pid and the lock path).
            InvalidArgument: the runtime directory or the lock file cannot be created or opened.
        """
        ensure_runtime_dir(runtime_dir)
        path = lock_path(runtime_dir, board).absolute()  # the busy message names it for operators
        fd = lock_pid_file(path, "runtime_dir", "board lock", lambda pid: BoardBusy(board, path, pid), InvalidArgument)
        return cls(board, path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Clear the pid and drop the lock (idempotent). The file stays, see the module docstring."""
        fd, self._fd = self._fd, None
        if fd is not None:
            unlock_pid_file(fd)

    def __enter__(self) -> BoardLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# ---- Unix sockets -------------------------------------------------------------------------------


class SocketState(enum.Enum):
    ABSENT = "absent"
    LIVE = "live"  # something accepts connections on it
    STALE = "stale"  # a socket file nobody listens on (ECONNREFUSED): left by a killed process
    NOT_SOCKET = "not a socket"


@dataclass(frozen=True)
class SocketIdentity:
    """Which file the daemon bound: compared before it removes the path at shutdown."""

    dev: int
    ino: int


def probe_socket(path: Path, timeout_s: float = PROBE_TIMEOUT_S) -> SocketState:
    """What is at `path`, found by `lstat` and, for a socket, a `connect`.

    Raises:
        InvalidArgument: a socket whose liveness cannot be told (permission denied, another socket
            type, a path too long): it is never replaced.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return SocketState.ABSENT
    except OSError as exc:
        raise InvalidArgument(f"listen: cannot inspect {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        return SocketState.NOT_SOCKET
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return SocketState.STALE
        except FileNotFoundError:
            return SocketState.ABSENT
        except (BlockingIOError, TimeoutError):  # a full backlog or a wedged listener: alive
            return SocketState.LIVE
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return SocketState.LIVE
            raise InvalidArgument(
                f"listen: cannot tell whether {path} is in use ({exc.strerror or exc}); not replacing it"
            ) from None
    return SocketState.LIVE


def check_socket_path(path: Path) -> SocketState:
    """Refuse a path that must not be replaced; never removes anything (a start-up pre-check).

    Raises:
        SocketInUse: a live process listens on it.
        InvalidArgument: it exists and is not a socket, or its liveness cannot be told.
    """
    state = probe_socket(path)
    if state is SocketState.LIVE:
        raise SocketInUse(f"listen: {path} is in use by a live process (a connect succeeded); not replacing it")
    if state is SocketState.NOT_SOCKET:
        raise InvalidArgument(f"listen: {path} exists and is not a socket; not replacing it")
    return state


def claim_socket_path(path: Path) -> None:
    """Make `path` free for a bind: remove a stale socket, refuse anything else that is there.

    Raises:
        SocketInUse, InvalidArgument: see `check_socket_path`.
    """
    if check_socket_path(path) is SocketState.STALE:
        log.info("removing stale socket %s (nothing listens on it)", path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def directory_lock(directory: Path, wait_s: float = DIR_LOCK_WAIT_S) -> Iterator[None]:
    """Hold an exclusive `flock` on `directory` (serialises claim + bind and the final unlink between
    daemons sharing it). Without read access to the directory, or past `wait_s`, it goes on unlocked
    (with a warning): `link` still refuses to replace a path that appeared meanwhile."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("cannot open %s to lock it (%s): binding without the directory lock", directory, exc.strerror)
        yield
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    log.warning("%s stayed locked for %.0fs: binding without the directory lock", directory, wait_s)
                    break
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # drops the lock


def private_bind_path(path: Path) -> Path:
    """Where grpc binds before the socket is linked to `path`: same directory, short, per process."""
    return path.parent / f".{os.getpid()}.bind"


def bind_unix(path: Path, bind: Callable[[Path], None]) -> SocketIdentity:
    """Claim `path`, bind a socket there through `bind(private_path)`, return its identity.

    Call with `directory_lock(path.parent)` held. `bind` must create a listening socket at the path it
    is given (grpc: `server.add_insecure_port("unix:" + str(private_path))`).

    Raises:
        SocketInUse: a live process listens on `path`, or a file appeared there during the bind.
        InvalidArgument: `path` holds something that is not a socket; the bind or the link failed.
    """
    claim_socket_path(path)
    private = private_bind_path(path)
    with contextlib.suppress(FileNotFoundError):
        private.unlink()  # left by a killed process with our pid: never live
    bind(private)
    try:
        os.chmod(private, SOCKET_MODE)
        try:
            os.link(private, path)
        except FileExistsError:
            raise SocketInUse(f"listen: {path} appeared while this daemon was binding; not replacing it") from None
        except OSError:  # a file system without hard links: the path was free a moment ago, under the lock
            os.rename(private, path)
        st = path.lstat()
    except OSError as exc:
        raise InvalidArgument(f"listen: cannot publish the socket at {path}: {exc.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            private.unlink()
    return SocketIdentity(st.st_dev, st.st_ino)


def remove_own_socket(path: Path, identity: SocketIdentity) -> bool:
    """Unlink `path` if it is still the socket this process bound (same device and inode).

    Returns:
        True if it was removed; False if it is gone or is someone else's now (then it is left alone).
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("not removing %s: cannot inspect it (%s)", path, exc.strerror)
        return False
    if (st.st_dev, st.st_ino) != (identity.dev, identity.ino):
        log.warning("not removing %s: it is no longer the socket this daemon bound", path)
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
