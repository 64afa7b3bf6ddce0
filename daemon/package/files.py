"""File-level checks of a package directory against the manifest's file list.

This module owns everything about bytes on disk: that every listed path stays inside the
package (no `..`, no absolute path, no symlink leading out, no symlink loop), is listed once,
exists as a regular file, has the declared size and SHA-256 (streamed in chunks, never read
whole; FIFOs and devices are never opened: `fs.open_regular`), and that the directory holds
nothing unlisted besides the manifest (walked iteratively: `fs.walk_entries`). It reads the
package, never writes it.
Findings go to the caller's `Findings` as `file.*` codes. A file whose size is wrong is not
hashed: its digest would differ anyway, and one defect gets one message.
Two passes: the first checks paths, kinds and sizes and keeps the files to hash; the second hashes
them, so the byte total (the manifest sizes of those files) is known before the first byte is read
and an optional `ByteThrottle` reports progress through it (`byte_progress`).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from calculet.daemon.package.byte_progress import ByteThrottle
from calculet.daemon.package.fs import NotRegularFile, is_symlink_loop, kind_of, open_regular, walk_entries
from calculet.daemon.package.manifest import MANIFEST_NAME, FileEntry
from calculet.daemon.package.report import Findings

_SHA256 = re.compile(r"[0-9a-f]{64}")  # fullmatch: `$` would accept a trailing newline
HASH_CHUNK = 1 << 20


def sha256_file(path: Path, chunk: int = HASH_CHUNK, on_chunk: Callable[[int], None] | None = None) -> str:
    """Hex SHA-256 of a regular file, read `chunk` bytes at a time.

    Args:
        path: the file.
        chunk: bytes per read.
        on_chunk: called with the length of each block read, after it is hashed.

    Raises:
        NotRegularFile: the path is (or became) a directory, FIFO, device or socket.
        OSError: it cannot be opened or read.
    """
    h = hashlib.sha256()
    with open_regular(path) as f:
        while block := f.read(chunk):
            h.update(block)
            if on_chunk is not None:
                on_chunk(len(block))
    return h.hexdigest()


@dataclass(frozen=True)
class _ToHash:
    """A listed file that passed the path, kind and size checks and waits for its SHA-256."""

    real: Path
    norm: str
    where: str
    entry: FileEntry


def normalize(rel: str) -> str | None:
    """Package-relative posix path in canonical form, or None when it is absolute or climbs out."""
    if not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel or re.match(r"^[A-Za-z]:", rel):
        return None
    norm = posixpath.normpath(rel)
    if norm == ".." or norm.startswith("../") or norm == ".":
        return None
    return norm


def resolve_inside(root: Path, rel: str) -> Path | None:
    """`root / rel` with symlinks resolved, or None when it resolves outside `root` (or loops)."""
    try:
        real = (root / rel).resolve()
    except (OSError, RuntimeError, ValueError):  # symlink loop: RuntimeError before 3.13, OSError after
        return None
    return real if real.is_relative_to(root) else None


class FileChecker:
    """Checks one package directory's files.

    Args:
        root: the package directory, already resolved (symlinks in it followed).
        findings: collector owned by the caller.
        verify_hashes: hash every file (the default); False skips SHA-256 for quick checks.
        throttle: reports the bytes hashed (total: the sizes of the files that get hashed); None
            reports nothing.
    """

    def __init__(
        self, root: Path, findings: Findings, verify_hashes: bool = True, throttle: ByteThrottle | None = None
    ) -> None:
        self.root = root
        self.findings = findings
        self.verify_hashes = verify_hashes
        self.throttle = throttle

    def check(self, entries: Sequence[FileEntry]) -> None:
        """Every listed file (paths, kinds, sizes, then hashes), then what is there unlisted."""
        listed: set[str] = set()
        to_hash: list[_ToHash] = []
        for i, entry in enumerate(entries):
            where = f"manifest.files[{i}]"
            norm = normalize(entry.path)
            if norm is None:
                self.findings.add(
                    "file.path_escape", where, f"{entry.path!r} is not package-relative (absolute, '..' or invalid)"
                )
                continue
            if norm in listed:
                self.findings.add("file.duplicate", where, f"{norm} is listed more than once")
                continue
            listed.add(norm)
            try:
                real = self._entry(entry, norm, where)
            except OSError as exc:
                self._unreadable(exc, norm, where)
                continue
            if real is not None and self.verify_hashes and _SHA256.fullmatch(entry.sha256):
                to_hash.append(_ToHash(real, norm, where, entry))
        self._hash_all(to_hash)
        self._extras(listed)

    def _unreadable(self, exc: NotRegularFile | OSError, norm: str, where: str) -> None:
        """Report a file that could not be judged: swapped for a special file, or unreadable."""
        if isinstance(exc, NotRegularFile):  # swapped for a FIFO or device after the stat in _entry
            self.findings.add("file.not_regular", where, f"{norm} is {exc.kind}, not a regular file")
        else:  # permissions, I/O error: the file is there but we cannot judge it
            self.findings.add("file.unreadable", where, f"{norm} cannot be read: {exc.strerror or exc}")

    def _hash_all(self, files: Sequence[_ToHash]) -> None:
        """SHA-256 of each file against the manifest, bytes reported through the throttle."""
        if self.throttle is not None:
            self.throttle.start(sum(f.entry.size for f in files))
        before = 0
        for f in files:
            self._hash_one(f, before)
            before += f.entry.size
            if self.throttle is not None:  # read whole or not: the file is done with
                self.throttle.update(before)
        if self.throttle is not None:
            self.throttle.finish()

    def _hash_one(self, f: _ToHash, before: int) -> None:
        """Hash one file; while it is read the throttle hears `before` + its bytes read so far, at
        most its manifest size, so the count rises monotonically to the total even if the file
        grows, shrinks or fails meanwhile."""
        throttle = self.throttle
        read = 0

        def on_chunk(n: int) -> None:
            nonlocal read
            read += n
            if throttle is not None:
                throttle.update(before + min(read, f.entry.size))

        try:
            digest = sha256_file(f.real, on_chunk=on_chunk)
        except (NotRegularFile, OSError) as exc:
            self._unreadable(exc, f.norm, f.where)
            return
        if digest != f.entry.sha256:
            self.findings.add("file.hash", f.where, f"{f.norm}: sha256 is {digest}, manifest says {f.entry.sha256}")

    def _entry(self, entry: FileEntry, norm: str, where: str) -> Path | None:
        """Path kind, then size: the resolved file to hash when both are right, else None.

        Raises:
            OSError: the file or its folder cannot be stat'ed.
        """
        if not _SHA256.fullmatch(entry.sha256):
            self.findings.add(
                "file.hash", where, f"{norm}: sha256 {entry.sha256[:80]!r} is not 64 lowercase hex digits"
            )
        path = self.root / norm
        if is_symlink_loop(path):  # before the existence test: a loop does not "exist" either
            self.findings.add("file.symlink_loop", where, f"{norm} (or a folder on its path) is a symlink loop")
            return None
        if not path.exists() and not path.is_symlink():
            self.findings.add("file.missing", where, f"{norm} is listed but not in the package")
            return None
        real = resolve_inside(self.root, norm)
        if real is None:
            self.findings.add("file.path_escape", where, f"{norm} is a symlink that resolves outside the package")
            return None
        try:
            info = real.stat()
        except FileNotFoundError:
            self.findings.add("file.missing", where, f"{norm} is missing (dangling symlink)")
            return None
        if not stat.S_ISREG(info.st_mode):
            self.findings.add("file.not_regular", where, f"{norm} is {kind_of(info.st_mode)}, not a regular file")
            return None
        size = info.st_size
        if size != entry.size:
            delta = size - entry.size
            kind = f"oversized by {delta:,} B" if delta > 0 else f"short by {-delta:,} B"
            self.findings.add("file.size", where, f"{norm} is {size:,} B, manifest says {entry.size:,} B ({kind})")
            return None
        return real

    def _extras(self, listed: set[str]) -> None:
        """Report every file or symlink under the root that the manifest does not list."""

        def unlistable(exc: OSError) -> None:
            rel = Path(exc.filename or self.root).relative_to(self.root).as_posix()
            self.findings.add("file.unreadable", rel, f"folder {rel} cannot be listed: {exc.strerror or exc}")

        # Symlinked folders are entries, never descended into; special files are entries too.
        for path in walk_entries(self.root, unlistable):
            rel = path.relative_to(self.root).as_posix()
            if rel == MANIFEST_NAME or rel in listed:
                continue
            self.findings.add("file.extra", rel, f"{rel} is in the package but not listed in the manifest")
