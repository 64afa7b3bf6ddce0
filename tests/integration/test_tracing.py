"""Request ids and traces across the real gateway and daemon processes.

Both run with `OTEL_TRACES_EXPORTER=console` (the SDK's console exporter writes each span as a JSON
object to stdout, which the fixtures keep in the process log), so the test reads the spans each
process exported and checks that they form one trace: the client's traceparent -> the gateway's
request span -> its `calculet.submit` attempt span -> the daemon's `calculet.job` span and its
queue/prefill/decode/sampling children. The request id the client gave is echoed in the response
header and appears on the gateway's log line and on the daemon's job lines (JSON lines here).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
REQUEST_ID = "req-trace-test-0042"
WAIT_S = 30.0


def exported_spans(log: str) -> list[dict[str, Any]]:
    """The console exporter's span objects in a process log (multi-line JSON from '{' to '}')."""
    spans, block = [], None
    for line in log.splitlines():
        if line == "{":
            block = [line]
        elif block is not None:
            block.append(line)
            if line == "}":
                obj = json.loads("\n".join(block))
                if "context" in obj:
                    spans.append(obj)
                block = None
    return spans


def json_lines(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith('{"ts"')]


def poll(read: Callable[[], list[dict[str, Any]]], ready: Callable[[list[dict[str, Any]]], bool]) -> list[Any]:
    deadline = time.monotonic() + WAIT_S
    while not ready(found := read()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out; found {found}")
        time.sleep(0.05)
    return found


def test_one_trace_and_one_request_id_from_client_through_gateway_to_daemon(
    start_daemon: Callable[..., DaemonProcess],
    start_gateway: Callable[..., GatewayProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # ms: export soon after the request
    daemon = start_daemon("--model", "tiny=tiny", "--log-format", "json")
    gateway = start_gateway("--daemon", daemon.target)
    headers = {"x-request-id": REQUEST_ID, "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    # Seeded and ignoring EOS: an unseeded T=1 draw could end at EOS on its first token (the
    # prefill's), and then the job has no decode span.
    body = {
        "model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "seed": 1, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    with gateway.http() as http, http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200 and r.headers["x-request-id"] == REQUEST_ID
        assert any("[DONE]" in line for line in r.iter_lines())

    gateway_spans = poll(lambda: exported_spans(gateway.log()), lambda s: len(s) >= 2)
    (request_span,) = [s for s in gateway_spans if s["name"] == "POST /v1/completions"]
    (attempt,) = [s for s in gateway_spans if s["name"] == "calculet.submit"]
    assert request_span["context"]["trace_id"] == f"0x{TRACE_ID}" and request_span["parent_id"] == f"0x{CLIENT_SPAN}"
    assert request_span["attributes"]["calculet.request_id"] == REQUEST_ID
    assert attempt["parent_id"] == request_span["context"]["span_id"]

    daemon_spans = poll(lambda: exported_spans(daemon.log()), lambda s: any(x["name"] == "calculet.job" for x in s))
    (job,) = [s for s in daemon_spans if s["name"] == "calculet.job"]
    assert job["context"]["trace_id"] == f"0x{TRACE_ID}", "the daemon continues the gateway's trace"
    assert job["parent_id"] == attempt["context"]["span_id"]
    assert job["attributes"]["calculet.request_id"] == REQUEST_ID
    children = {s["name"] for s in daemon_spans if s["parent_id"] == job["context"]["span_id"]}
    assert {"queue", "prefill", "decode"} <= children
    assert any(s["name"] == "sampling" for s in daemon_spans)
    assert all(s["context"]["trace_id"] == f"0x{TRACE_ID}" for s in daemon_spans)

    # The same request id on the gateway's line and on the daemon's job lines (JSON fields).
    assert f"request {REQUEST_ID}: POST /v1/completions -> 200" in gateway.log()
    job_lines = poll(
        lambda: [line for line in json_lines(daemon.log()) if line.get("request_id") == REQUEST_ID],
        lambda lines: len(lines) >= 2,
    )
    assert {line["job_id"] for line in job_lines} == {job["attributes"]["calculet.job_id"]}
    assert [line["message"].split(":")[0].split()[-1] for line in job_lines] == ["queued", "finished"]


def test_a_request_id_is_made_when_the_client_gives_none_or_a_bad_one(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess]
) -> None:
    daemon = start_daemon("--model", "tiny=tiny")
    gateway = start_gateway("--daemon", daemon.target)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    with gateway.http() as http:
        made = http.post("/v1/completions", json=body).headers["x-request-id"]
        too_long = http.post("/v1/completions", json=body, headers={"x-request-id": "x" * 129})
    assert len(made) == 32 and int(made, 16) >= 0
    assert too_long.status_code == 200 and len(too_long.headers["x-request-id"]) == 32
    assert f"request {made}: POST /v1/completions -> 200" in gateway.log()
    assert f"queued: request {made}," in daemon.log()
