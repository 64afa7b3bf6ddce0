"""PackageWriter: the file ledger refuses paths, roles and files it cannot account for."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from calculet.common.errors import CalculetError, ErrorKind
from calculet.ops.sim_packages.writer import PackageWriter


def test_entries_hash_what_was_written(tmp_path: Path) -> None:
    w = PackageWriter(tmp_path)
    w.write_bytes("b/x.bin", b"\x00\x01", "command")
    w.write_text("a.txt", "hé", "metadata")
    entries = w.entries()
    assert [e.path for e in entries] == ["a.txt", "b/x.bin"]
    assert entries[0].size == len("hé".encode())
    assert entries[1].sha256 == hashlib.sha256(b"\x00\x01").hexdigest()


@pytest.mark.parametrize("rel", ["/abs.bin", "../up.bin", "a/../../up.bin", "calculet-package.json", ""])
def test_bad_paths_are_refused(tmp_path: Path, rel: str) -> None:
    with pytest.raises(CalculetError, match="not a plain relative file path") as info:
        PackageWriter(tmp_path / "pkg").write_bytes(rel, b"x", "metadata")
    assert info.value.kind is ErrorKind.INTERNAL
    assert not (tmp_path / "up.bin").exists()


def test_twice_unknown_role_and_unwritten_are_refused(tmp_path: Path) -> None:
    w = PackageWriter(tmp_path)
    w.write_bytes("a.bin", b"x", "command")
    with pytest.raises(CalculetError, match="written twice"):
        w.write_bytes("a.bin", b"y", "command")
    with pytest.raises(CalculetError, match="unknown role"):
        w.write_bytes("b.bin", b"y", "junk")
    with pytest.raises(CalculetError, match="not written"):
        w.adopt("c.bin", "command")


def test_unregistered_files_are_found(tmp_path: Path) -> None:
    w = PackageWriter(tmp_path)
    w.write_bytes("a.bin", b"x", "command")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "sneaky.bin").write_bytes(b"z")
    (tmp_path / "calculet-package.json").write_text("{}")  # the manifest is never listed
    with pytest.raises(CalculetError, match=r"in the package: sub/sneaky\.bin$"):
        w.entries()
