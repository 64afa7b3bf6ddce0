"""Access control end to end, with real processes (calsim, time scale 0):

- the gateway's API keys (`--api-key-file`): /v1/* answers 401 in OpenAI's shape without a key or
  with a wrong one (plain httpx and the official `openai` client), 200 with a right one, and the
  probes (/health, /ready, /metrics) stay open;
- the daemon's access planes from the gateway's side: with `--daemon-token-file` (an inference
  token) the gateway serves from a daemon that checks tokens; without it the board stays down and
  requests get 503 (never a 401 that would blame the caller's key);
- TLS: the gateway dials a daemon on TCP with mutual TLS (`--daemon-ca`, `--daemon-cert`,
  `--daemon-key`, `--daemon-server-name`) and a token.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from calculet.client import DaemonClient, TlsConfig
from calculet.common.errors import Unavailable
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import BASE_URL, GatewayProcess
from tests.integration.tls_helpers import free_port, wait_tls_serving
from tests.unit.client.pki import SERVER_NAME, make_pki

pytestmark = pytest.mark.integration
KEYS = ("sk-calculet-one", "sk-calculet-two")
MESSAGES = [{"role": "user", "content": "Say something."}]
CHAT = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "seed": 1}
INFERENCE_TOKEN = "inference-7f3a"
OPERATE_TOKEN = "operate-c41d"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _invalid_api_key(message: str) -> dict[str, object]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


def test_api_keys_guard_v1_and_leave_the_probes_open(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    keys = _write(tmp_path / "api-keys", "# clients of the test\n" + "\n".join(KEYS) + "\n")
    gateway = start_gateway("--daemon", daemon.target, "--api-key-file", str(keys))  # ready: /ready is open

    with gateway.http() as http:
        for path in ("/health", "/ready", "/metrics"):
            assert http.get(path).status_code == 200, path
        missing = http.post("/v1/chat/completions", json=CHAT)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert missing.json() == _invalid_api_key("missing API key: send the header `Authorization: Bearer <key>`")
        for wrong in ("sk-calculet-three", KEYS[0][:-1], "Bearer"):
            refused = http.get("/v1/models", headers=_bearer(wrong))
            assert refused.status_code == 401
            assert refused.json() == _invalid_api_key("incorrect API key provided")
        for key in KEYS:
            models = http.get("/v1/models", headers=_bearer(key))
            assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["tiny"]
        chat = http.post("/v1/chat/completions", json=CHAT, headers=_bearer(KEYS[1]))
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] >= 1

    with gateway.openai() as unkeyed, pytest.raises(openai.AuthenticationError) as info:  # api_key="unused"
        unkeyed.models.list()
    assert info.value.status_code == 401
    assert (info.value.code, info.value.type) == ("invalid_api_key", "invalid_request_error")
    keyed = openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key=KEYS[0], http_client=gateway.http(), max_retries=0)
    with keyed:
        reply = keyed.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, seed=1)  # type: ignore[arg-type]
        assert reply.choices[0].finish_reason in ("length", "stop")
        streamed = keyed.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, seed=1, stream=True)  # type: ignore[arg-type]
        text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
        assert text == reply.choices[0].message.content


def test_the_gateway_needs_its_inference_token_for_a_daemon_that_checks_tokens(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    inference = _write(tmp_path / "inference.tokens", f"# gateways\n{INFERENCE_TOKEN}\n")
    operate = _write(tmp_path / "operate.tokens", f"{OPERATE_TOKEN}\n")
    daemon = start_daemon(
        "--model", "tiny=tiny", "--token-file-inference", str(inference), "--token-file-operate", str(operate)
    )

    with_token = start_gateway("--daemon", daemon.target, "--daemon-token-file", str(inference))
    with with_token.http() as http:
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200

    without = start_gateway("--daemon", daemon.target, wait_ready=False)
    without.wait_until(lambda body: list(body["boards"].values()) == ["down"], "the board refused (down)")
    with without.http() as http:
        assert http.get("/ready").status_code == 503
        refused = http.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503, refused.text  # the gateway's misconfiguration, not the caller's
    down = [line for line in without.log().splitlines() if ": down (WatchLoad" in line]
    assert down and "Bearer" in down[0], without.log()  # the operator sees why: the daemon's refusal


def test_the_gateway_dials_a_tcp_daemon_with_mutual_tls(
    models_root: Path, start_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    inference = _write(tmp_path / "inference.tokens", f"{INFERENCE_TOKEN}\n")
    (tmp_path / "tls-daemon").mkdir()
    tls_args = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca)]
    daemon = DaemonProcess(
        tmp_path / "tls-daemon",
        models_root,
        ["--model", "tiny=tiny", *tls_args, "--token-file-inference", str(inference)],
        listen=f"127.0.0.1:{free_port()}",
    )
    try:
        mutual = TlsConfig(pki.ca, pki.client_cert, pki.client_key, server_name=SERVER_NAME)
        wait_tls_serving(daemon, mutual)
        gateway = start_gateway(
            "--daemon", daemon.target, "--daemon-token-file", str(inference), "--daemon-ca", str(pki.ca),
            "--daemon-cert", str(pki.client_cert), "--daemon-key", str(pki.client_key),
            "--daemon-server-name", SERVER_NAME,
        )  # fmt: skip
        with gateway.http() as http:
            reply = http.post("/v1/chat/completions", json=CHAT)
            assert reply.status_code == 200, reply.text
        # The same daemon refuses a client without its certificate (the gateway's flags matter).
        no_cert = TlsConfig(pki.ca, server_name=SERVER_NAME)
        with (
            DaemonClient(daemon.target, timeout=5.0, tls=no_cert) as bare,
            pytest.raises(Unavailable),
            contextlib.closing(bare.watch_health()) as statuses,  # type: ignore[type-var]
        ):
            next(statuses)
    finally:
        code = daemon.stop()
        if code not in (0, -signal.SIGTERM):
            print(f"---- daemon log (exit {code}) ----\n{daemon.log()}")
