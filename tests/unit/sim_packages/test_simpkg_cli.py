"""`calctl package build-sim`: exit codes for usage errors (2), problems (1) and success (0)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.daemon.package.manifest import load_manifest
from calculet.ops import calctl
from calculet.ops.commands.package_build import parse_decode_batches


def _exit_code(argv: list[str]) -> int:
    try:
        return calctl.main(argv)
    except SystemExit as exc:  # argparse reports usage errors this way
        return int(exc.code or 0)


@pytest.mark.parametrize("value", ["0", "1,1", "4,1,4", "x", "1,x", "1,", "", "1.5", "-4", "17", "1;4"])
def test_bad_decode_batch_is_a_usage_error(tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = _exit_code(["package", "build-sim", "--preset", "tiny", "--decode-batch", value, str(tmp_path / "p")])
    assert code == 2
    assert "--decode-batch" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(("flag", "value"), [("--lanes", "0"), ("--lanes", "two"), ("--lane-context", "-1")])
def test_bad_numbers_are_usage_errors(tmp_path: Path, flag: str, value: str) -> None:
    argv = ["package", "build-sim", "--preset", "qwen3-30b-a3b", flag, value, str(tmp_path / "p")]
    assert _exit_code(argv) == 2


def test_unknown_preset_is_a_usage_error(tmp_path: Path) -> None:
    assert _exit_code(["package", "build-sim", "--preset", "llama", str(tmp_path / "p")]) == 2


def test_inconsistent_options_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["package", "build-sim", "--preset", "qwen3-30b-a3b", "--lanes", "2", str(tmp_path / "p")]
    assert _exit_code(argv) == 2
    assert "invalid_argument" in capsys.readouterr().err


def test_build_then_refuse_then_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p"
    argv = ["package", "build-sim", "--preset", "qwen3-30b-a3b", "--decode-batch", "4,1", str(out)]
    assert _exit_code(argv) == 0
    assert capsys.readouterr().out.strip() == str(out.absolute())
    assert [s.batch for s in load_manifest(out).submodels_for("decode")] == [1, 4]
    assert _exit_code(argv) == 1
    assert "not empty" in capsys.readouterr().err
    assert _exit_code([*argv[:-1], "--force", "--lanes", "5", str(out)]) == 0
    assert load_manifest(out).kv.lanes == 5


def test_kv_that_does_not_fit_is_a_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "package",
        "build-sim",
        "--preset",
        "qwen3-30b-a3b",
        "--lane-context",
        "40960",
        str(tmp_path / "p"),
    ]
    assert _exit_code(argv) == 1
    assert "failed_precondition" in capsys.readouterr().err


@given(st.lists(st.integers(1, 16), min_size=1, max_size=6))
def test_parse_decode_batches(values: list[int]) -> None:
    text = ",".join(map(str, values))
    if len(set(values)) == len(values):
        assert parse_decode_batches(text) == tuple(sorted(values))
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="more than once"):
            parse_decode_batches(text)
