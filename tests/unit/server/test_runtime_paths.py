"""The host's default runtime directory, where board locks live without `--runtime-dir` (issue 21).

- The order: `$RUNTIME_DIRECTORY` (its first entry), `$XDG_RUNTIME_DIR/calculet`, `/run/calculet` when
  this user may write there, `/tmp/calculet-<uid>`.
- Empty or relative variables are ignored; the answer is absolute and the same from any working
  directory.
- The `/tmp` fallback is used only when it is missing or this user's own directory (not a symlink,
  not a file, not another user's).

`/run` and `/tmp` are temp dirs here (`run_root`, `tmp_root`); nothing outside them is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from calculet.common.errors import InvalidArgument
from calculet.daemon.runtime_paths import default_runtime_dir

UID = os.getuid()


def _roots(tmp_path: Path, run: str = "run") -> dict[str, Path]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {"run_root": tmp_path / run, "tmp_root": tmp_path / "tmp"}


def test_systemd_then_xdg_then_run_then_the_per_user_fallback(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    roots = _roots(tmp_path)
    env = {"RUNTIME_DIRECTORY": "/run/calculet:/run/other", "XDG_RUNTIME_DIR": "/run/user/7"}
    assert default_runtime_dir(env, **roots) == Path("/run/calculet")
    del env["RUNTIME_DIRECTORY"]
    assert default_runtime_dir(env, **roots) == Path("/run/user/7/calculet")
    # /run is writable: /run/calculet, missing (created by the lock) or already there.
    assert default_runtime_dir({}, **roots) == tmp_path / "run" / "calculet"
    (tmp_path / "run" / "calculet").mkdir()
    assert default_runtime_dir({}, **roots) == tmp_path / "run" / "calculet"
    # No /run to write in: the per-user fallback.
    no_run = _roots(tmp_path, run="no-run")
    assert default_runtime_dir({}, **no_run, uid=UID) == tmp_path / "tmp" / f"calculet-{UID}"
    assert default_runtime_dir({}, **no_run) == tmp_path / "tmp" / f"calculet-{UID}"


def test_empty_or_relative_variables_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    roots = _roots(tmp_path)
    expected = tmp_path / "run" / "calculet"
    assert default_runtime_dir({"RUNTIME_DIRECTORY": "", "XDG_RUNTIME_DIR": ""}, **roots) == expected
    assert default_runtime_dir({"RUNTIME_DIRECTORY": "run", "XDG_RUNTIME_DIR": "xdg"}, **roots) == expected
    assert default_runtime_dir({"RUNTIME_DIRECTORY": ":/run/x"}, **roots) == expected  # first entry only


def test_the_default_does_not_depend_on_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def defaults_from(cwd: str) -> list[Path]:
        (tmp_path / cwd).mkdir()
        monkeypatch.chdir(tmp_path / cwd)
        envs: list[dict[str, str]] = [{}, {"XDG_RUNTIME_DIR": "/run/user/7"}, {"RUNTIME_DIRECTORY": "/run/c"}]
        return [default_runtime_dir(env, **_roots(tmp_path, run="no-run")) for env in envs]

    first = defaults_from("a")
    assert all(path.is_absolute() for path in first)
    assert defaults_from("b") == first


def test_a_run_calculet_that_is_not_a_directory_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "calculet").write_text("not a directory")
    assert default_runtime_dir({}, **_roots(tmp_path), uid=UID) == tmp_path / "tmp" / f"calculet-{UID}"


def test_the_tmp_fallback_must_be_this_users_own_directory(tmp_path: Path) -> None:
    roots = _roots(tmp_path, run="no-run")
    fallback = tmp_path / "tmp" / f"calculet-{UID}"
    fallback.mkdir()
    assert default_runtime_dir({}, **roots, uid=UID) == fallback
    # Another user's directory (it exists, and `uid` does not own it).
    other = tmp_path / "tmp" / f"calculet-{UID + 1}"
    other.mkdir()
    with pytest.raises(InvalidArgument, match=f"not a directory owned by uid {UID + 1}"):
        default_runtime_dir({}, **roots, uid=UID + 1)
    # A symlink to this user's directory, and a file.
    fallback.rmdir()
    fallback.symlink_to(other)
    with pytest.raises(InvalidArgument, match="--runtime-dir"):
        default_runtime_dir({}, **roots, uid=UID)
    fallback.unlink()
    fallback.write_text("x")
    with pytest.raises(InvalidArgument, match="runtime_dir"):
        default_runtime_dir({}, **roots, uid=UID)
