"""calctl against a daemon on TCP with TLS and per-plane tokens (the real processes, calsim at time
scale 0): with `--tls-ca`, `--tls-server-name` and `--token-file` (or their environment variables)
`calctl status --json` answers; without the CA, without the token, or with half a TLS setting it
fails with exit 1 and one line on stderr that says what is missing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.calctl_process import one_calctl_line, run_calctl
from tests.integration.conftest import DaemonProcess
from tests.integration.tls_helpers import tls_daemon
from tests.unit.client.pki import SERVER_NAME, Pki, make_pki

pytestmark = pytest.mark.integration
OBSERVE_TOKEN = "observe-5e1f"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "observe.token"
    path.write_text(f"# calctl's token\n{OBSERVE_TOKEN}\n", encoding="utf-8")
    return path


@pytest.fixture
def daemon(tmp_path: Path, models_root: Path, pki: Pki, token_file: Path) -> Iterator[DaemonProcess]:
    with tls_daemon(
        tmp_path / "tls-daemon", models_root, pki, "--model", "tiny=tiny", "--token-file-observe", str(token_file)
    ) as started:
        yield started


def _boards(stdout: str) -> list[dict[str, object]]:
    boards = json.loads(stdout)["boards"]
    assert isinstance(boards, list)
    return boards


def test_status_json_over_tls_with_a_token_file(daemon: DaemonProcess, pki: Pki, token_file: Path) -> None:
    tls = ["--tls-ca", str(pki.ca), "--tls-server-name", SERVER_NAME]
    proc = run_calctl("status", "--json", "--daemon", daemon.target, *tls, "--token-file", str(token_file))
    assert proc.returncode == 0, proc.stderr
    (board,) = _boards(proc.stdout)
    assert board["target"] == daemon.target and board["health"] == "serving" and board["error"] is None
    assert [m["alias"] for m in board["models"]] == ["tiny"]  # type: ignore[attr-defined]


def test_the_tls_settings_come_from_the_environment_too(daemon: DaemonProcess, pki: Pki, token_file: Path) -> None:
    env = {"CALCULET_TLS_CA": str(pki.ca), "CALCULET_TLS_SERVER_NAME": SERVER_NAME, "CALCULET_DAEMON": daemon.target}
    proc = run_calctl("--token-file", str(token_file), "--json", "status", env=env)
    assert proc.returncode == 0, proc.stderr
    assert _boards(proc.stdout)[0]["health"] == "serving"
    proc = run_calctl("health", env={**env, "CALCULET_TOKEN": OBSERVE_TOKEN})
    assert proc.returncode == 0 and proc.stdout.startswith("board SERVING"), proc.stderr


def test_without_the_ca_without_the_token_or_with_half_a_setting_one_clear_line(
    daemon: DaemonProcess, pki: Pki, token_file: Path
) -> None:
    target = ["--daemon", daemon.target]
    tls = ["--tls-ca", str(pki.ca), "--tls-server-name", SERVER_NAME]
    one_calctl_line(
        run_calctl("health", *target, "--token-file", str(token_file)),
        "calctl: unavailable:", "plaintext", "--tls-ca",
    )  # fmt: skip
    one_calctl_line(run_calctl("health", *target, *tls), "calctl: unauthenticated:", "observe")
    one_calctl_line(
        run_calctl("health", *target, "--tls-ca", str(pki.ca), "--token-file", str(token_file)),
        "calctl: unavailable:", "--tls-server-name",
    )  # fmt: skip
    one_calctl_line(
        run_calctl("health", *target, "--tls-cert", str(pki.client_cert), "--token-file", str(token_file)),
        "calctl: invalid_argument:", "--tls-cert", "without --tls-ca",
    )  # fmt: skip
    one_calctl_line(
        run_calctl("health", *target, *tls, "--token-file", str(token_file.parent / "missing")),
        "calctl: invalid_argument:", "token-file", "missing",
    )  # fmt: skip
    proc = run_calctl("health", *target, *tls, "--token-file", str(token_file), "--tls-ca", str(pki.ca))
    assert proc.returncode == 2 and "--tls-ca given twice" in proc.stderr.splitlines()[-1]
