"""Reading a package directory without trusting it: the file-system primitives the validator uses.

This module owns how package bytes are opened and walked, so that no package can make the
validator block, recurse without bound or read more than it means to: a file is read only when
it is a regular file (checked before opening, so a FIFO or device is never opened, and again on
the open descriptor, so a swap in between is caught), at most `limit` bytes; symlink loops are
recognised as such (pathlib raises RuntimeError for them on Python < 3.13, OSError ELOOP after);
folders are walked with an explicit stack (os.walk recurses once per level on 3.11). It reads,
never writes, and raises typed exceptions that the checks turn into validator codes.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

# O_NONBLOCK: should a FIFO replace the file between the check and the open, the open returns at
# once instead of waiting for a writer. O_NOCTTY: a terminal never becomes our controlling tty.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


class FileRefused(Exception):
    """A package file is deliberately not read (what it is, not an I/O failure)."""


class NotRegularFile(FileRefused):
    """The path is a directory, FIFO, device node or socket.

    Attributes:
        kind: what it is instead, for messages ("a FIFO").
    """

    def __init__(self, path: Path, kind: str) -> None:
        super().__init__(f"{path.name} is {kind}, not a regular file")
        self.kind = kind


class FileTooLarge(FileRefused):
    """The file holds more than the reader's limit.

    Attributes:
        size: bytes found (at least `limit + 1`).
        limit: the cap.
    """

    def __init__(self, path: Path, size: int, limit: int) -> None:
        super().__init__(f"{path.name} is {size:,} B, over the {limit:,} B limit")
        self.size = size
        self.limit = limit


def kind_of(mode: int) -> str:
    """What a stat mode describes, for messages ("a directory", "a FIFO", ...)."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISREG, "a regular file"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


def is_symlink_loop(path: Path) -> bool:
    """Whether resolving `path` (or one of its folders) runs into a symlink loop.

    A missing path, or one that cannot be resolved for any other reason, is not a loop.
    """
    try:
        path.resolve(strict=True)
    except RuntimeError:  # pathlib's "Symlink loop from ..." before Python 3.13
        return True
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading; anything else is refused before it is opened.

    Args:
        path: the file (symlinks followed).

    Returns:
        The open binary file; the caller closes it.

    Raises:
        NotRegularFile: a directory, FIFO, device or socket (checked before and after the open).
        OSError: it cannot be stat'ed or opened (missing, permission denied, symlink loop, ...).
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, kind_of(mode))
    fd = os.open(path, _OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped after the stat above
            raise NotRegularFile(path, kind_of(mode))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, limit: int) -> bytes:
    """The whole content of a regular file of at most `limit` bytes.

    Raises:
        NotRegularFile: not a regular file.
        FileTooLarge: more than `limit` bytes (its stat'ed size, or what a growing file yields);
            nothing beyond `limit + 1` bytes is read.
        OSError: it cannot be opened or read.
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise FileTooLarge(path, size, limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(path, len(data), limit)
    return data


def walk_entries(root: Path, onerror: Callable[[OSError], None]) -> Iterator[Path]:
    """Every entry under `root` that is not a real folder, folder by folder in name order.

    Real folders are descended into; symlinks (to folders too) are entries and never followed.
    Iterative, so however deep the tree, no recursion limit is hit.

    Args:
        root: the folder to walk.
        onerror: called with the OSError of a folder that cannot be listed; the walk goes on.

    Yields:
        Paths of files, symlinks, FIFOs, devices and sockets.
    """
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            onerror(exc)
            continue
        subfolders = []
        for entry in entries:
            try:
                is_folder = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_folder = False
            if is_folder:
                subfolders.append(Path(entry.path))
            else:
                yield Path(entry.path)
        pending.extend(reversed(subfolders))  # pop() takes them in name order
