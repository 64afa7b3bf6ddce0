"""`calctl package validate` and `calctl capacity`, run in-process: exit codes and what they print."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from calculet.daemon.package.capacity import MemoryModel, max_context_for
from calculet.daemon.package.manifest import MANIFEST_NAME
from calculet.daemon.package.presets import QWEN3_30B_A3B
from calculet.ops.calctl import main

from .conftest import VOCAB, PackageFactory, valid_manifest, with_required


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err


# ---------------------------------------------------------------- package validate


def test_validate_valid_package_exits_0(factory: PackageFactory, capsys: pytest.CaptureFixture[str]) -> None:
    root = factory.write()
    code, out = _run(capsys, "package", "validate", str(root))
    assert code == 0
    assert out.strip().splitlines() == [f"{root}: valid (0 error(s), 0 warning(s))"]


def test_validate_lists_each_problem_then_a_summary(
    factory: PackageFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    m = valid_manifest()
    root = factory.write(replace(m, kernel="cuda", tokenizer=replace(m.tokenizer, eos_token_ids=(VOCAB,))))
    (root / "stray.txt").write_text("x")
    code, out = _run(capsys, "package", "validate", str(root))
    lines = out.strip().splitlines()
    assert code == 1
    assert len(lines) == 4
    assert {line.split()[1] for line in lines[:3]} == {"kernel.unknown", "tokenizer.token_range", "file.extra"}
    assert "INVALID" in lines[3] and "3 error(s)" in lines[3]


def test_validate_warnings_only_exits_0(factory: PackageFactory, capsys: pytest.CaptureFixture[str]) -> None:
    m = valid_manifest()
    root = factory.write(replace(m, tokenizer=replace(m.tokenizer, model_max_length=131_072)))
    code, out = _run(capsys, "package", "validate", str(root))
    assert code == 0
    assert out.startswith("warning") and "clamped to" in out


def test_validate_json(factory: PackageFactory, capsys: pytest.CaptureFixture[str]) -> None:
    root = factory.write()
    (root / "param_blk0.bin").write_bytes(b"short")
    code, out = _run(capsys, "package", "validate", "--json", str(root))
    data = json.loads(out)
    assert code == 1
    assert data["ok"] is False and data["errors"] == 1
    assert [p["code"] for p in data["problems"]] == ["file.size"]


def test_validate_skip_hashes(factory: PackageFactory, capsys: pytest.CaptureFixture[str]) -> None:
    root = factory.write()
    data = bytearray((root / "hparam.yaml").read_bytes())
    data[0] ^= 1
    (root / "hparam.yaml").write_bytes(bytes(data))
    assert _run(capsys, "package", "validate", "--skip-hashes", str(root))[0] == 0
    assert _run(capsys, "package", "validate", str(root))[0] == 1


def test_validate_directory_without_manifest_is_invalid_not_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run(capsys, "package", "validate", str(tmp_path))
    assert code == 1 and "manifest.missing" in out


def test_validate_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no such directory" in _usage_error(capsys, "package", "validate", str(tmp_path / "absent"))
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert "not a directory" in _usage_error(capsys, "package", "validate", str(a_file))
    _usage_error(capsys, "package", "validate")


# ---------------------------------------------------------------- capacity


def test_capacity_preset_default_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, "capacity", "--preset", "qwen3-30b-a3b")
    assert code == 0
    assert "40,960" in out and "all choices fit" in out


def test_capacity_four_full_lanes_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, "capacity", "--preset", "qwen3-30b-a3b", "--lanes", "1", "4", "--context", "40960")
    assert code == 1
    assert "does not fit: 4 lane(s) x 40,960 tokens" in out
    assert "does not fit: 1 lane(s)" not in out
    limit = max_context_for(MemoryModel.from_preset(QWEN3_30B_A3B), 4)
    assert f"longest context for 4 lane(s): {limit:,} tokens" in out


def test_capacity_json_rows_and_limits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, "capacity", "--preset", "qwen3-30b-a3b", "--lanes", "2", "3", "--json")
    data = json.loads(out)
    assert code == 1
    assert [(r["lanes"], r["context"], r["fits"]) for r in data["rows"]] == [(2, 40960, True), (3, 40960, False)]
    assert data["max_context_for_lanes"]["2"] == 40960
    assert all(len(r["chips"]) == 2 for r in data["rows"])


def test_capacity_smaller_dram_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "capacity", "--preset", "qwen3-30b-a3b", "--dram-gib", "16")[0] == 0
    code, out = _run(capsys, "capacity", "--preset", "qwen3-30b-a3b", "--dram-gib", "14", "--json")
    assert code == 1
    assert json.loads(out)["device"]["dram_bytes_per_chip"] == 14 * (1 << 30)


def test_capacity_package_own_layout(factory: PackageFactory, capsys: pytest.CaptureFixture[str]) -> None:
    root = factory.write()
    code, out = _run(capsys, "capacity", "--package", str(root))
    assert code == 0 and "all choices fit" in out
    m = valid_manifest()
    code, out = _run(capsys, "capacity", "--package", str(root), "--lanes", "1000000")
    assert code == 1 and f"{m.kv.lanes} (own)" in out


def test_capacity_package_whose_own_layout_does_not_fit(
    factory: PackageFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    m = valid_manifest()
    root = factory.write(with_required(replace(m, kv=replace(m.kv, lanes=1 << 20))))
    code, out = _run(capsys, "capacity", "--package", str(root), "--lanes", "1", "--json")
    data = json.loads(out)
    assert code == 1
    assert data["rows"][0]["fits"] is True and data["package_layout"]["fits"] is False


def test_capacity_package_with_broken_manifest_is_a_problem(
    factory: PackageFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    root = factory.write()
    (root / MANIFEST_NAME).write_text("{")
    assert main(["capacity", "--package", str(root)]) == 1
    assert "failed_precondition" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["capacity"],
        ["capacity", "--preset", "qwen3-30b-a3b", "--package", "."],
        ["capacity", "--preset", "llama"],
        ["capacity", "--preset", "tiny", "--lanes", "0"],
        ["capacity", "--preset", "tiny", "--context", "-1"],
        ["capacity", "--preset", "tiny", "--context", "many"],
        ["capacity", "--preset", "tiny", "--dram-gib", "0"],
        ["capacity", "--preset", "tiny", "--dram-gib", "nan"],
        ["capacity", "--package", "/nonexistent/pkg"],
    ],
)
def test_capacity_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _usage_error(capsys, *argv)
