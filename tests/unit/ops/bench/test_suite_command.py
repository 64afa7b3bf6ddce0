"""`calctl bench suite` as a command (flags, `--list`, the canonical command line) and `calctl bench`'s
timing-model flags against the fake daemon (tests/unit/client/fake_daemon.py: its Status says policy
continuous, in-flight 2, and carries no device utilisation)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.ops.bench.suite.matrix import Selection, expand, quick_matrix
from calculet.ops.bench.suite.runner import SuiteContext, bench_argv
from calculet.ops.calctl import build_parser, main
from calculet.ops.commands.bench_suite import suite_command
from calculet.ops.sim_packages import build_sim_package
from tests.unit.client.conftest import start_server
from tests.unit.client.fake_daemon import FakeDaemon
from tests.unit.ops.calctl_fakes import usage_error


def calctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--time-scale", "0"), "argument --time-scale: '0': must be a number > 0"),
        (("--time-scale", "fast"), "argument --time-scale: 'fast': expected auto or a number"),
        (("--decode-batches", "4,4"), "decode batches: 4 given more than once"),
        (("--decode-batches", "32"), "decode batch 32: must be an integer in 1..16"),
        (("--concurrency", "0,2"), "argument --concurrency: '0,2': every value must be at least 1"),
        (("--concurrency", "two"), "expected whole numbers separated by commas"),
        (("--configs", ","), "argument --configs: ',': expected names separated by commas"),
        (("--requests", "0"), "argument --requests: '0': must be at least 1"),
        (("--preset", "huge"), "argument --preset: invalid choice: 'huge'"),
        (("--json",), "unrecognized arguments: --json"),
    ],
)
def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    assert message in usage_error(capsys, "bench", "suite", *argv)


def test_an_unknown_configuration_is_refused_before_anything_is_built(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = calctl(capsys, "bench", "suite", "--dir", str(tmp_path), "--configs", "if3-b2")
    assert (code, out) == (1, "")
    assert err.startswith("calctl: invalid_argument: unknown configuration if3-b2 (this matrix has: if1-b1, ")
    assert not (tmp_path / "models").exists()


def test_list_builds_the_packages_and_shows_the_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ("bench", "suite", "--preset", "tiny", "--quick", "--dir", str(tmp_path), "--decode-batches", "1,4")
    code, out, err = calctl(capsys, *argv, "--configs", "serial,if2-b4", "--time-scale", "0.5", "--list")
    assert code == 0, err
    lines = out.splitlines()
    assert "== building calsim package tiny-serial (decode batch 1, lanes default)" in lines
    assert "== building calsim package tiny-b4 (decode batch 4, lanes 4)" in lines
    assert "serial: tiny-serial, 1 board(s), time scale 0.5" in lines
    runs = [line.strip().split(":")[0] for line in lines if line.startswith("  ")]
    assert runs == [
        "serial.short.c1.gateway", "serial.short.c1.daemon", "serial.short.c16.gateway", "serial.short.c16.daemon",
        "if2-b4.short.c1.gateway", "if2-b4.short.c1.daemon", "if2-b4.short.c16.gateway", "if2-b4.short.c16.daemon",
        "if2-b4.mixed.c16.gateway",
    ]  # fmt: skip
    assert lines[-1].startswith("9 runs, at least ~")
    assert not (tmp_path / "suite.json").exists() and not (tmp_path / "fleets").exists()
    code, out, _ = calctl(capsys, *argv, "--list")  # the packages are reused
    assert code == 0 and "building" not in out


def test_the_canonical_command() -> None:
    args = build_parser().parse_args(
        ["bench", "suite", "--quick", "--preset", "tiny", "--dir", "d", "--configs", "serial,if2-b4", "--requests", "3"]
    )
    assert suite_command(args) == (
        "calctl bench suite --preset tiny --dir d --quick --decode-batches 1,4,8,16 --configs if2-b4,serial "
        "--requests 3 --time-scale auto --seed 0"
    )
    slo = build_parser().parse_args(["bench", "suite", "--dir", "d", "--slo", "ttft:500,tpot:50"])
    assert suite_command(slo).endswith("--time-scale auto --slo ttft:500,tpot:50 --seed 0")  # goodput in every run


def test_every_matrix_run_carries_the_suites_slo(tmp_path: Path) -> None:
    (run, *_) = expand(quick_matrix((4,)), lambda _f: 512, Selection())
    fleet = type("F", (), {"base_url": "http://127.0.0.1:1", "targets": ()})()
    package = type("P", (), {"path": tmp_path})()
    for slo, expected in ((None, []), ("ttft:500", ["--slo", "ttft:500"])):
        ctx = SuiteContext(tmp_path, tmp_path, "m", 0, lambda *_: None, print, 1.0, slo)  # type: ignore[arg-type]
        argv = bench_argv(run, fleet, tmp_path / "p.txt", package, 0.5, ctx, 10.0)  # type: ignore[arg-type]
        assert argv[-len(expected) :] == expected if expected else "--slo" not in argv


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[str]:
    fake = FakeDaemon()
    server = start_server(fake, tmp_path / "d.sock")
    yield f"unix://{tmp_path}/d.sock"
    fake.open_all_gates()
    server.stop(grace=None).wait(5)


def test_bench_relates_a_run_to_the_timing_model(
    capsys: pytest.CaptureFixture[str], daemon: str, tmp_path: Path
) -> None:
    package = build_sim_package("tiny", tmp_path / "tiny", decode_batches=[1, 4])
    argv = ("bench", "--daemon", daemon, "--model", "tiny", "--requests", "4", "--concurrency", "2")
    flags = ("--timing-package", str(package), "--time-scale", "0.5", "--json", "--no-progress")
    code, out, err = calctl(capsys, *argv, "--prompt-len", "3", "--output-len", "4", *flags)
    assert code == 0, err
    tm = json.loads(out)["timing_model"]
    assert (tm["package"], tm["time_scale"], tm["policy"], tm["max_inflight"], tm["boards"]) == (
        str(package), 0.5, "continuous", 2, 1
    )  # fmt: skip
    assert tm["load"] == {"in_flight": 2.0, "rows": 2, "decode_batch": 4}
    assert tm["limit"]["output_tokens_per_s"] > 0 and tm["relative"]["ttft"]["count"] == 4
    assert tm["relative"]["busy_of_wall"] is None  # the fake daemon reports no utilisation


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--time-scale", "1"), "invalid_argument: --time-scale says how fast the --timing-package runs"),
        (("--timing-package", "/nonexistent/pkg"), "failed_precondition: "),
    ],
)
def test_bad_timing_flags_are_one_line(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    code, out, err = calctl(capsys, "bench", "--model", "tiny", "--no-progress", *argv)
    assert (code, out) == (1, "")
    assert err.startswith(f"calctl: {message}") and len(err.strip().splitlines()) == 1, err


def test_a_negative_time_scale_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, "bench", "--model", "tiny", "--time-scale", "-1")
    assert "argument --time-scale: '-1': must be a finite number >= 0" in err
