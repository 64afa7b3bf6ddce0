"""calctl status / health / load / unload / drain / resume, run in-process against the fake daemon:
what they print, what they send, and their exit codes (0 ok, 1 refused/failed/unreachable, 2 usage)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from calculet.ops.calctl import main
from calculet.ops.commands.daemon_cmds import DEFAULT_DAEMON, ENV_DAEMON, ENV_TOKEN

from .fake_daemon import Failure, FakeDaemon


def calctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err


# ---- status ----------------------------------------------------------------------------


def test_status_summarises_the_board(capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon) -> None:
    code, out, err = calctl(capsys, "status", "--daemon", daemon)
    assert code == 0 and err == ""
    for fact in (
        "board fake-0",
        "calsim",
        "health SERVING",
        "in flight 1/2",
        "CONTINUOUS",
        "ccu exception on job 57",  # last reset reason
        "1/3 automatic resets per 600 s",
        "submitted 120",
        "quarantined 1",
    ):
        assert fact in out, fact
    assert "9.00" in out and "10.00" in out and "16.00" in out  # DRAM used per chip, total
    model_row = next(line for line in out.splitlines() if line.lstrip("│ ").startswith("tiny"))
    assert "READY" in model_row and "1/1/1/1/1" in model_row and "1/2/5" in model_row  # lanes by state, queues
    assert "120/30" in model_row  # prefix hit/miss tokens
    lines = out.splitlines()
    assert any(all(fact in line for fact in ("ACTIVE", "job-7", "37")) for line in lines)
    assert any(all(fact in line for fact in ("UNKNOWN", "job-9")) for line in lines)
    assert "job-10" in out and "QUEUED" in out and "req-a" in out


def test_status_shows_draining_and_json(capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon) -> None:
    fake.draining = True
    code, out, _ = calctl(capsys, "status", "--daemon", daemon)
    assert code == 0 and "DRAINING" in out
    code, out, _ = calctl(capsys, "status", "--daemon", daemon, "--json", "--full")
    data = json.loads(out)
    assert code == 0 and data["draining"] is True and data["health"] == "SERVING_STATUS_DRAINING"
    assert [lane["kv_length"] for lane in data["models"][0]["lanes"]] == [37, 0, 0, 0, 50]


# ---- health ----------------------------------------------------------------------------


def test_health_exits_0_when_serving(capsys: pytest.CaptureFixture[str], daemon: str) -> None:
    code, out, err = calctl(capsys, "health", "--daemon", daemon)
    assert code == 0 and err == ""
    assert out.splitlines()[0].startswith("board SERVING, device healthy")
    assert "tiny: SERVING, state READY, generation 3" in out


@pytest.mark.parametrize(("draining", "status"), [(True, "DRAINING"), (False, "NOT_SERVING")])
def test_health_exits_1_otherwise(
    capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon, draining: bool, status: str
) -> None:
    fake.draining = draining
    if not draining:
        fake.models["tiny"].state = 8  # MODEL_STATE_FAILED: nothing READY
    code, out, err = calctl(capsys, "health", "--daemon", daemon)
    assert code == 1
    assert out.startswith(f"board {status}")
    assert err.count("\n") == 1 and err.startswith(f"calctl: not serving: {status}")
    code, out, _ = calctl(capsys, "health", "--daemon", daemon, "--json")
    assert code == 1 and json.loads(out)["status"] == f"SERVING_STATUS_{status}"


def test_an_unreachable_daemon_is_one_line_on_stderr_and_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for command in ("status", "health", "resume", "drain"):
        code, out, err = calctl(capsys, command, "--daemon", str(tmp_path / "nobody.sock"))
        assert code == 1 and out == ""
        assert err.startswith("calctl: unavailable: ") and err.count("\n") == 1, err


def test_target_comes_from_the_environment_then_the_default(
    capsys: pytest.CaptureFixture[str], daemon: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_DAEMON, daemon)
    assert calctl(capsys, "health")[0] == 0
    monkeypatch.delenv(ENV_DAEMON)
    monkeypatch.chdir(tmp_path)  # the default unix:run/board0.sock does not exist here
    code, _, err = calctl(capsys, "health")
    assert code == 1 and "unavailable" in err
    assert DEFAULT_DAEMON == "unix:run/board0.sock"


def test_a_bad_environment_target_is_an_invalid_argument(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_DAEMON, "nowhere")
    code, _, err = calctl(capsys, "status")
    assert code == 1 and err.startswith("calctl: invalid_argument: target 'nowhere'")


def test_the_token_comes_from_the_environment(
    capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_TOKEN, "ops-token")
    assert calctl(capsys, "resume", "--daemon", daemon)[0] == 0
    ((_, metadata),) = fake.calls_of("Resume")
    assert metadata["authorization"] == "Bearer ops-token"


def test_refusals_print_the_kind(capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon) -> None:
    fake.fail["Status"] = Failure(grpc.StatusCode.PERMISSION_DENIED, "the observe plane needs another token")
    code, out, err = calctl(capsys, "status", "--daemon", daemon)
    assert (code, out) == (1, "")
    assert err == "calctl: permission_denied: the observe plane needs another token\n"


# ---- load ------------------------------------------------------------------------------


def test_load_prints_progress_and_exits_0_when_ready(
    capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon
) -> None:
    code, out, err = calctl(capsys, "load", "t2", "packages/tiny", "--daemon", daemon, "--lanes", "2")
    assert code == 0 and err == ""
    states = [line.split()[1] for line in out.splitlines()]
    assert states == ["VALIDATING", "CONFIGURING", "WARMING", "READY"]
    assert "t2" in fake.models
    ((req, _),) = fake.calls_of("Load")
    assert (req.alias, req.package, req.options.replace, req.options.lanes) == ("t2", "packages/tiny", False, 2)
    assert not req.options.HasField("drain_timeout_ms")


def test_load_replace_with_drain_timeout(capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon) -> None:
    code, _, _ = calctl(
        capsys, "load", "tiny", "packages/tiny", "--replace", "--drain-timeout", "2.5", "--daemon", daemon
    )
    assert code == 0
    ((req, _),) = fake.calls_of("Load")
    assert req.options.replace and req.options.drain_timeout_ms == 2500


def test_load_json_is_one_object_per_progress(capsys: pytest.CaptureFixture[str], daemon: str) -> None:
    code, out, _ = calctl(capsys, "load", "t2", "packages/tiny", "--daemon", daemon, "--json")
    progress = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and progress[-1]["done"] is True and progress[-1]["state"] == "MODEL_STATE_READY"
    assert [p["done"] for p in progress[:-1]] == [False] * (len(progress) - 1)


def test_a_failed_load_exits_1_with_its_error(capsys: pytest.CaptureFixture[str], daemon: str) -> None:
    code, out, err = calctl(capsys, "load", "bad", "packages/broken", "--daemon", daemon)
    assert code == 1
    assert out.splitlines()[-1].split()[1] == "FAILED" and "hash mismatch" in out
    assert err == "calctl: failed_precondition: param_blk0.bin: hash mismatch\n"


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (("tiny", "packages/tiny"), "failed_precondition"),  # loaded, no --replace
        (("t2", "packages/none"), "not_found"),
        (("t2", "../outside"), "invalid_argument"),
        (("a b", "packages/tiny"), "invalid_argument"),
    ],
)
def test_refused_loads_exit_1(
    capsys: pytest.CaptureFixture[str], daemon: str, argv: tuple[str, ...], kind: str
) -> None:
    code, out, err = calctl(capsys, "load", *argv, "--daemon", daemon)
    assert (code, out) == (1, "")
    assert err.startswith(f"calctl: {kind}: ") and err.count("\n") == 1


# ---- unload / drain / resume -----------------------------------------------------------


def test_unload(capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon) -> None:
    code, out, _ = calctl(capsys, "unload", "tiny", "--drain-timeout", "0", "--daemon", daemon)
    assert code == 0 and "unloaded tiny generation 3" in out and "1 interrupted" in out
    ((req, _),) = fake.calls_of("Unload")
    assert req.HasField("drain_timeout_ms") and req.drain_timeout_ms == 0
    code, _, err = calctl(capsys, "unload", "tiny", "--daemon", daemon)
    assert code == 1 and err.startswith("calctl: not_found: model 'tiny'")


def test_drain_and_resume(capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon) -> None:
    code, out, err = calctl(capsys, "drain", "--timeout", "1.5", "--daemon", daemon)
    assert code == 0 and "drained" in out and err == ""
    ((req, _),) = fake.calls_of("Drain")
    assert req.timeout_ms == 1500 and not req.interrupt_remaining
    assert fake.draining
    code, out, _ = calctl(capsys, "resume", "--daemon", daemon)
    assert code == 0 and out == "board admitting again\n" and not fake.draining
    code, out, _ = calctl(capsys, "resume", "--daemon", daemon, "--json")
    assert code == 0 and json.loads(out) == {"was_draining": False}


def test_drain_with_jobs_left_exits_1_unless_interrupted(
    capsys: pytest.CaptureFixture[str], daemon: str, fake: FakeDaemon
) -> None:
    fake.remaining_jobs = 3
    code, out, err = calctl(capsys, "drain", "--daemon", daemon)
    assert code == 1 and "NOT drained" in out and err == "calctl: drain: 3 job(s) still running or queued\n"
    code, out, _ = calctl(capsys, "drain", "--interrupt", "--daemon", daemon, "--json")
    assert code == 0 and json.loads(out) == {"drained": True, "remaining_jobs": 0, "interrupted_jobs": 3}


# ---- usage errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("status", "--daemon", "nowhere"), "target 'nowhere'"),
        (("health", "--daemon", "unix://relative.sock"), "absolute path"),
        (("drain", "--timeout", "-1"), "between 0 and 3600"),
        (("drain", "--timeout", "soon"), "expected a number"),
        (("unload", "tiny", "--drain-timeout", "4000"), "between 0 and 3600"),
        (("load", "tiny"), "PACKAGE"),
        (("load", "tiny", "p", "--lanes", "0"), "must be >= 1"),
        (("unload",), "ALIAS"),
        (("resume", "--json", "extra"), "unrecognized arguments"),
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    assert message in usage_error(capsys, *argv)
