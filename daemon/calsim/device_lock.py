"""One process per emulated board, as a real runtime holds its device node (issue 21).

`hold_board(directory, board)` takes an exclusive, non-blocking `flock` on `<directory>/board<N>.lock`
and writes the holder's pid into it; `BoardHold.release` (from `CalsimDevice.close`, or when the
device is garbage-collected) gives it back, and the kernel drops it when the process dies. Another
process opening the same board meanwhile gets `DeviceBusy` naming the holder's pid and the file.
Opens within one process share one hold (counted): calsim boards opened in one process are
independent emulations, and tests open many. A forked child inherits none of its parent's holds
(`os.register_at_fork`): it opens the board as any other process would, and is refused.

The directory (`state_dir`): the `state_dir` driver option, else `$CALSIM_STATE_DIR` (both made
absolute), else `calsim/` in the host's default runtime directory (`calculet.daemon.runtime_paths`:
`/run/calculet/calsim` under systemd). It is created 0750 when missing. The lock file is never
removed (a second opener would lock a fresh inode while the first holds the old one).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from calculet.daemon.device.errors import DeviceBusy, DeviceError, InvalidJob
from calculet.daemon.errors import CalculetError
from calculet.daemon.runtime_paths import default_runtime_dir

STATE_DIR_ENV = "CALSIM_STATE_DIR"
STATE_SUBDIR = "calsim"
DIR_MODE = 0o750
FILE_MODE = 0o640
OPEN_ATTEMPTS = 5  # retried only when the file was replaced between open and flock


def state_dir(option: Path | None, environ: Mapping[str, str] = os.environ) -> Path:
    """Where the board lock files live (see the module docstring).

    Raises:
        InvalidJob: no option or variable, and the default runtime directory is refused.
    """
    if option is not None:
        return option.absolute()
    if environ.get(STATE_DIR_ENV):
        return Path(environ[STATE_DIR_ENV]).absolute()
    try:
        return default_runtime_dir(environ) / STATE_SUBDIR
    except CalculetError as exc:
        raise InvalidJob(f"calsim state_dir: {exc} (or set the state_dir option or ${STATE_DIR_ENV})") from None


@dataclass
class _Held:
    """This process's flock on one lock file and how many open devices share it."""

    fd: int
    count: int = 0


_guard = threading.Lock()
_held: dict[Path, _Held] = {}


class BoardHold:
    """One open device's share of its board's lock. `release` is idempotent."""

    def __init__(self, board: int, path: Path, held: _Held) -> None:
        self.board = board
        self.path = path
        self._held: _Held | None = held

    @property
    def held(self) -> bool:
        return self._held is not None

    def release(self) -> None:
        with _guard:
            held, self._held = self._held, None
            if held is None or _held.get(self.path) is not held:  # released, or held before a fork
                return
            held.count -= 1
            if held.count > 0:
                return
            del _held[self.path]
            with contextlib.suppress(OSError):
                os.ftruncate(held.fd, 0)  # no stale pid for an operator to chase
            os.close(held.fd)


def hold_board(directory: Path, board: int) -> BoardHold:
    """Hold board `board`'s lock in `directory` (created if missing) for one open device.

    Raises:
        DeviceBusy: another process holds it.
        DeviceError: the directory or the lock file cannot be created, opened or locked.
    """
    path = directory / f"board{board}.lock"
    with _guard:
        held = _held.get(path)
        if held is None:
            held = _Held(_lock(path, board))
            _held[path] = held
        held.count += 1
        return BoardHold(board, path, held)


def _lock(path: Path, board: int) -> int:
    """An fd of `path` holding its exclusive flock, the pid written in it."""
    _ensure_dir(path.parent)
    for _ in range(OPEN_ATTEMPTS):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
        except OSError as exc:
            raise DeviceError(f"calsim: cannot open the device lock {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            holder = f"pid {pid}" if pid is not None else "another process"
            raise DeviceBusy(f"calsim board {board} is already open in {holder} (device lock {path})") from None
        except OSError as exc:
            os.close(fd)
            raise DeviceError(f"calsim: cannot lock {path}: {exc.strerror}") from None
        if _same_file(fd, path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
            return fd
        os.close(fd)  # unlinked or replaced after our open: lock the file that is there now
    raise DeviceError(f"calsim: the device lock {path} keeps being replaced")


def _ensure_dir(directory: Path) -> None:
    if directory.is_dir():
        return
    try:
        directory.mkdir(mode=DIR_MODE, parents=True)
        os.chmod(directory, DIR_MODE)  # mkdir's mode is filtered by the umask
    except FileExistsError:
        if not directory.is_dir():
            raise DeviceError(f"calsim state_dir: {directory} exists and is not a directory") from None
    except OSError as exc:
        raise DeviceError(f"calsim state_dir: cannot create {directory}: {exc.strerror}") from None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _forget_after_fork() -> None:
    """In a forked child: drop the parent's holds (closing our copies leaves the parent's locks)."""
    global _guard
    _guard = threading.Lock()  # the parent's may have been held by another thread at the fork
    for held in _held.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _held.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
