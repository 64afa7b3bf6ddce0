"""An exclusive, non-blocking `flock` on a file that names its holder's pid: the one mechanism behind
a daemon's board lock (`server/ownership.py`) and calsim's device lock (`calsim/device_lock.py`).

`lock_pid_file` opens (creating) the file, takes the lock without waiting, and writes the pid into it
for operators; the kernel drops the lock when the process dies, so a lock is never stale. The file is
never removed: a second process would lock a fresh inode while the first still holds the old one. If
the path was unlinked or replaced between the open and the lock, the file now there is locked instead.
Callers give the wording and the error types, so each lock keeps its own messages.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

DIR_MODE = 0o750
FILE_MODE = 0o640
OPEN_ATTEMPTS = 5  # retried only when the file was replaced between open and flock

Fail = Callable[[str], Exception]  # builds the error for a message


def make_dir(directory: Path, label: str, fail: Fail) -> None:
    """Create `directory` (mode 0750, parents too) if it is missing.

    Args:
        label: the setting it comes from, first in every message ("runtime_dir").
        fail: the error type for a failure.
    Raises:
        What `fail` builds: it cannot be created, or exists and is not a directory.
    """
    if directory.is_dir():
        return
    try:
        directory.mkdir(mode=DIR_MODE, parents=True)
        os.chmod(directory, DIR_MODE)  # mkdir's mode is filtered by the umask
    except FileExistsError:
        if not directory.is_dir():
            raise fail(f"{label}: {directory} exists and is not a directory") from None
    except OSError as exc:
        raise fail(f"{label}: cannot create {directory}: {exc.strerror}") from None


def lock_pid_file(path: Path, label: str, noun: str, busy: Callable[[int | None], Exception], fail: Fail) -> int:
    """Hold `path`'s exclusive flock with this process's pid written in it.

    Args:
        label: first in every message ("runtime_dir", "calsim").
        noun: what the file is, in messages ("board lock").
        busy: the error for a lock another process holds, given its pid when the file names one.
        fail: the error type for anything else.
    Returns:
        The open descriptor holding the lock (close it to release).
    Raises:
        What `busy` or `fail` builds.
    """
    for _ in range(OPEN_ATTEMPTS):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
        except OSError as exc:
            raise fail(f"{label}: cannot open the {noun} {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = read_pid(fd)
            os.close(fd)
            raise busy(pid) from None
        except OSError as exc:
            os.close(fd)
            raise fail(f"{label}: cannot lock {path}: {exc.strerror}") from None
        if _same_file(fd, path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
            return fd
        os.close(fd)  # unlinked or replaced after our open: lock the file that is there now
    raise fail(f"{label}: the {noun} {path} keeps being replaced")


def unlock_pid_file(fd: int) -> None:
    """Clear the pid (no stale pid for an operator to chase) and drop the lock."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    os.close(fd)


def holder(pid: int | None) -> str:
    """Who holds a lock, for messages: "pid N", or "another process" when the file names none."""
    return f"pid {pid}" if pid is not None else "another process"


def read_pid(fd: int) -> int | None:
    """The pid a lock file names, or None."""
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
