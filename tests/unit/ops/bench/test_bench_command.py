"""`calctl bench` in-process against the fake daemon (tests/unit/client/fake_daemon.py: token chunks
of two, no device utilisation in its Status): the JSON report's counts, the outputs (table, --json
OUT, --json alone), exit codes, and every bad flag refused with a clear message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calculet.ops.bench import plot
from calculet.ops.calctl import main
from tests.unit.client.conftest import start_server
from tests.unit.client.fake_daemon import VOCAB, FakeDaemon
from tests.unit.ops.calctl_fakes import usage_error


def calctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `calctl argv` run in-process."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def fake() -> FakeDaemon:
    return FakeDaemon()


@pytest.fixture
def daemon(tmp_path: Path, fake: FakeDaemon) -> Iterator[str]:
    server = start_server(fake, tmp_path / "d.sock")
    yield f"unix://{tmp_path}/d.sock"
    fake.open_all_gates()
    server.stop(grace=None).wait(5)


def bench_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = calctl(capsys, "bench", *argv, "--json", "--no-progress")
    return code, json.loads(out), err


def test_a_closed_loop_run_reports_every_request_and_token(
    capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon
) -> None:
    argv = ("--daemon", daemon, "--model", "tiny", "--requests", "6", "--concurrency", "3", "--warmup", "2")
    code, report, err = bench_json(capsys, *argv, "--prompt-len", "3:5", "--output-len", "4", "--seed", "9")
    assert code == 0, err
    counts = report["counts"]
    assert (counts["requests"], counts["completed"], counts["failed"], counts["warmup_failed"]) == (6, 6, 0, 0)
    assert counts["output_tokens"] == counts["requested_output_tokens"] == 6 * 4
    assert 6 * 3 <= counts["prompt_tokens"] <= 6 * 5
    lat = report["latency_ms"]
    assert lat["ttft"]["count"] == lat["tpot"]["count"] == lat["e2e"]["count"] == 6
    assert lat["itl"]["count"] == 6 * 2  # chunks of 2 tokens: the second chunk's gap is shared by its 2 tokens
    workload = {"source": "random", "prompt_len": [3, 5], "vocab": VOCAB, "output_len": [4, 4]}
    assert report["config"]["workload"] == workload
    assert report["config"]["schedule"] == {"mode": "closed", "concurrency": 3}
    submits = [req for req, _ in fake.calls_of("Submit")]
    assert len(submits) == 8  # warm-up included
    assert sorted(s.sampling.seed for s in submits) == [9 + i for i in range(8)]
    board = report["device"]["boards"][0]
    assert board["target"] == daemon and "no device utilization" in board["error"]
    assert report["device"]["busy_ratio"] is None


def test_json_to_a_file_prints_the_table_too(capsys: pytest.CaptureFixture[str], daemon: str, tmp_path: Path) -> None:
    out_file = tmp_path / "r.json"
    argv = ("bench", "--daemon", daemon, "--model", "tiny", "--requests", "2", "--vocab", "50", "--rate", "inf")
    code, out, _ = calctl(capsys, *argv, "--json", str(out_file), "--slo", "ttft:60000")
    assert code == 0
    report = json.loads(out_file.read_text())
    assert report["counts"]["completed"] == 2 and report["goodput"]["good_requests"] == 2
    assert report["config"]["schedule"] == {"mode": "open", "rate": "inf", "burstiness": 1.0, "seed": 0}
    assert "calctl bench" in out and "TTFT" in out and "goodput (ttft <= 60000 ms)" in out


def test_the_global_json_flag_before_the_command_prints_json(capsys: pytest.CaptureFixture[str], daemon: str) -> None:
    code, out, _ = calctl(capsys, "--json", "bench", "--daemon", daemon, "--model", "tiny", "--requests", "1")
    assert code == 0 and json.loads(out)["counts"]["completed"] == 1


def test_a_jsonl_file_sets_the_prompts_and_output_lengths(
    capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon, tmp_path: Path
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_tokens": [1, 2], "max_tokens": 3}\n{"prompt_tokens": [5], "max_tokens": 1}\n')
    code, report, _ = bench_json(capsys, "--daemon", daemon, "--model", "tiny", "--prompts", str(prompts))
    assert code == 0
    assert report["counts"]["requests"] == 2 and report["counts"]["output_tokens"] == 3 + 1
    assert [list(req.prompt_tokens) for req, _ in fake.calls_of("Submit")] == [[1, 2], [5]]
    assert report["latency_ms"]["tpot"]["count"] == 1  # the one-token request has no TPOT


def test_failed_requests_are_reported_and_exit_1(capsys: pytest.CaptureFixture[str], daemon: str) -> None:
    code, report, err = bench_json(capsys, "--daemon", daemon, "--model", "nosuch", "--requests", "3", "--vocab", "9")
    assert code == 1
    assert report["counts"]["failed"] == 3 and report["counts"]["completed"] == 0
    assert report["errors"][0].startswith("request 0: not_found: model 'nosuch' is not loaded")
    assert err.strip() == (
        "calctl: bench: 3 of 3 requests failed; first: request 0: not_found: model 'nosuch' is not loaded"
    )


def test_the_progress_bar_goes_to_stderr(capsys: pytest.CaptureFixture[str], daemon: str) -> None:
    code, out, err = calctl(capsys, "bench", "--daemon", daemon, "--model", "tiny", "--requests", "3", "--progress")
    assert code == 0 and "3/3" in err and "3/3" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--rate", "0"), "argument --rate: '0': must be a number > 0 (or inf)"),
        (("--rate", "fast"), "argument --rate: 'fast': expected a number"),
        (("--concurrency", "0"), "argument --concurrency: '0': must be at least 1"),
        (("--concurrency", "2", "--rate", "3"), "not allowed with argument"),
        (("--burstiness", "-1"), "argument --burstiness: '-1': must be a number > 0"),
        (("--requests", "2.5"), "argument --requests: '2.5': expected a whole number"),
        (("--warmup", "-1"), "argument --warmup: '-1': must be at least 0"),
        (("--prompt-len", "9:3"), "argument --prompt-len: --prompt-len '9:3': expected 1 <= LO <= HI"),
        (("--output-len", "x"), "argument --output-len: --output-len 'x': expected N or LO:HI"),
        (("--slo", "ttft"), "argument --slo: --slo 'ttft': expected KEY:MS pairs"),
        (("--timeout", "inf"), "argument --timeout: 'inf': must be a number > 0"),
        (("--daemon", "nohost"), "argument --daemon"),
        (("--gateway", "localhost:8000"), "argument --gateway: --gateway 'localhost:8000': expected http(s)://"),
    ],
)
def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    assert message in usage_error(capsys, "bench", "--model", "tiny", *argv)


def test_model_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert "the following arguments are required: --model" in usage_error(capsys, "bench")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--burstiness", "2"), "invalid_argument: --burstiness shapes the arrivals of --rate: give --rate too"),
        (("--api-key-file", "k"), "invalid_argument: --api-key-file is for --gateway"),
        (("--gateway", "unix:/nonexistent/gw.sock"), "unavailable: gateway unix:/nonexistent/gw.sock: GET /ready"),
        (
            ("--gateway", "unix:g.sock", "--api-key-file", "/nonexistent/k"),
            "invalid_argument: api-key-file /nonexistent/k: cannot be read",
        ),
        (("--prompts", "/nonexistent/p.jsonl"), "invalid_argument: /nonexistent/p.jsonl: cannot be read"),
    ],
)
def test_refusals_are_one_line(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    code, out, err = calctl(capsys, "bench", "--model", "tiny", "--no-progress", *argv)
    assert (code, out) == (1, "")
    assert err.startswith(f"calctl: {message}") and len(err.strip().splitlines()) == 1, err


def test_no_daemon_to_ask_for_the_vocabulary(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    gone = f"unix:{tmp_path}/gone.sock"
    code, out, err = calctl(capsys, "bench", "--daemon", gone, "--model", "tiny", "--timeout", "1")
    assert code == 1 and out == ""
    assert err.startswith("calctl: unavailable: cannot learn the model's vocabulary size (") and "give --vocab N" in err


def test_plot_without_matplotlib_refuses_before_any_request(
    capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plot.importlib.util, "find_spec", lambda name: None)
    code, out, err = calctl(capsys, "bench", "--daemon", daemon, "--model", "tiny", "--plot", str(tmp_path / "p.png"))
    assert code == 1 and out == ""
    assert err.strip() == "calctl: failed_precondition: --plot needs matplotlib: pip install 'calculet[bench]'"
    assert fake.calls_of("Submit") == [] and fake.calls_of("GetModel") == []
