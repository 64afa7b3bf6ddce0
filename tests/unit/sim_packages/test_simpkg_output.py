"""OUT handling: refuse non-empty without --force, replace with it, never leave half a package."""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.common.errors import FailedPrecondition
from calculet.daemon.package.manifest import MANIFEST_NAME, load_manifest
from calculet.ops.sim_packages import build, build_sim_package


def _build(out: Path, force: bool = False) -> Path:
    return build_sim_package("qwen3-30b-a3b", out, decode_batches=[1], force=force)


def test_fresh_and_empty_out_are_accepted(tmp_path: Path) -> None:
    assert _build(tmp_path / "a" / "b") == (tmp_path / "a" / "b").absolute()
    (tmp_path / "empty").mkdir()
    _build(tmp_path / "empty")
    assert (tmp_path / "empty" / MANIFEST_NAME).is_file()


def test_non_empty_out_is_refused_and_untouched(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FailedPrecondition, match="not empty"):
        _build(out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_force_replaces_everything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _build(out)
    (out / "stray.bin").write_bytes(b"x")
    _build(out, force=True)
    listed = {e.path for e in load_manifest(out).files} | {MANIFEST_NAME}
    assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} == listed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or old copies left


def test_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(FailedPrecondition, match="not a directory"):
        _build(tmp_path / "f", force=True)


def test_out_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(FailedPrecondition, match="symlink"):
        _build(tmp_path / "link", force=True)


def test_failed_build_leaves_out_and_no_staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    _build(out)
    before = (out / MANIFEST_NAME).read_bytes()

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(build, "compute_golden", boom)
    with pytest.raises(RuntimeError, match="kernel exploded"):
        _build(out, force=True)
    assert (out / MANIFEST_NAME).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
