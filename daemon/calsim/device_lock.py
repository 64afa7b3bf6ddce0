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
removed (a second opener would lock a fresh inode while the first holds the old one). The lock itself
is `calculet.daemon.pid_lock`'s, as the daemon's board lock is.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from calculet.common.errors import CalculetError
from calculet.daemon.device.errors import DeviceBusy, DeviceError, InvalidJob
from calculet.daemon.pid_lock import holder, lock_pid_file, make_dir, unlock_pid_file
from calculet.daemon.runtime_paths import default_runtime_dir

STATE_DIR_ENV = "CALSIM_STATE_DIR"
STATE_SUBDIR = "calsim"


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
            unlock_pid_file(held.fd)


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
            make_dir(directory, "calsim state_dir", DeviceError)
            fd = lock_pid_file(
                path,
                "calsim",
                "device lock",
                lambda pid: DeviceBusy(f"calsim board {board} is already open in {holder(pid)} (device lock {path})"),
                DeviceError,
            )
            held = _Held(fd)
            _held[path] = held
        held.count += 1
        return BoardHold(board, path, held)


def _forget_after_fork() -> None:
    """In a forked child: drop the parent's holds (closing our copies leaves the parent's locks)."""
    global _guard
    _guard = threading.Lock()  # the parent's may have been held by another thread at the fork
    for held in _held.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _held.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
