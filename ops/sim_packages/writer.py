"""The file ledger of a package being built: every file written is registered with its role.

`PackageWriter` owns the staging directory's contents while a build runs: builders write (or
adopt files written by a library) only through it, each under a package-relative POSIX path
with a role. `entries()` then hashes them into the manifest's file list and checks that the
directory holds exactly the registered files, so nothing unlisted can slip into a package.
The manifest itself is the one file never listed (it cannot contain its own hash).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

from calculet.common.errors import CalculetError
from calculet.daemon.package.manifest import MANIFEST_NAME, FileEntry

# The manifest's roles; "params-standin" marks a small file standing in for a vendor param block
# that was not shipped (its declared memory figures are the real block's, its size is not).
ROLES = ("params", "params-standin", "command", "elf", "helper", "metadata", "tokenizer", "weights")


class PackageWriter:
    """Writes files into `root` and remembers each one's role.

    Args:
        root: the staging directory; this writer owns its contents until `entries()` is taken.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._roles: dict[str, str] = {}

    def path(self, rel: str) -> Path:
        """Absolute path for package-relative `rel`, parent folders created.

        Raises:
            CalculetError: `rel` is absolute, escapes the package, or is already registered (a bug).
        """
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts or rel in (MANIFEST_NAME, ""):
            raise CalculetError(f"package path {rel!r} is not a plain relative file path")
        if rel in self._roles:
            raise CalculetError(f"package file {rel!r} written twice")
        target = self.root.joinpath(*pure.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def write_bytes(self, rel: str, data: bytes, role: str) -> None:
        self.path(rel).write_bytes(data)
        self.adopt(rel, role)

    def write_text(self, rel: str, text: str, role: str) -> None:
        self.write_bytes(rel, text.encode("utf-8"), role)

    def write_json(self, rel: str, obj: Any, role: str) -> None:
        self.write_text(rel, json.dumps(obj, indent=2, ensure_ascii=False) + "\n", role)

    def adopt(self, rel: str, role: str) -> None:
        """Register a file that something else wrote at `self.path(rel)`.

        Raises:
            CalculetError: unknown role, or the file is not there (a bug in the builder).
        """
        if role not in ROLES:
            raise CalculetError(f"package file {rel!r}: unknown role {role!r}")
        if not self.root.joinpath(*PurePosixPath(rel).parts).is_file():
            raise CalculetError(f"package file {rel!r} was registered but not written")
        self._roles[rel] = role

    def entries(self) -> tuple[FileEntry, ...]:
        """The manifest's file list, sorted by path, with sizes and SHA-256 read back from disk.

        Raises:
            CalculetError: the directory holds a file nobody registered (a bug in the builder).
        """
        on_disk = {p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file() or p.is_symlink()}
        stray = sorted(on_disk - set(self._roles) - {MANIFEST_NAME})
        if stray:
            raise CalculetError(f"unregistered files in the package: {', '.join(stray)}")
        return tuple(self._entry(rel) for rel in sorted(self._roles))

    def _entry(self, rel: str) -> FileEntry:
        path = self.root.joinpath(*PurePosixPath(rel).parts)
        with path.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        return FileEntry(rel, path.stat().st_size, digest, self._roles[rel])
