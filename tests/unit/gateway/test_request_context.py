"""The gateway's request ids and spans, in-process (Starlette's TestClient over fake boards, an
in-memory span exporter): the id reaches every Submit, the attempt span's context is what the
daemon receives, a failover is a second attempt span under the same request span."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.testclient import TestClient

from calculet.gateway.api.app import create_app
from calculet.gateway.telemetry.request_context import request_id_from
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import serving

COMPLETION = {"model": ALIAS, "prompt": "hi", "max_tokens": 6, "seed": 1}
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def _client(daemons: list[FakeDaemon], provider: TracerProvider | None) -> TestClient:
    return TestClient(create_app(serving(*daemons), tracer_provider=provider))


def test_request_id_from_keeps_usable_ids_only() -> None:
    assert request_id_from([(b"x-request-id", b"abc-9")]) == "abc-9"
    for bad in (b"", b"x" * 129, b"tab\there", "caf\u00e9".encode()):
        made = request_id_from([(b"x-request-id", bad)])
        assert len(made) == 32 and made != bad.decode("latin-1")
    assert request_id_from([]) != request_id_from([]), "a new id each time"


def test_the_request_id_reaches_every_submit_without_tracing() -> None:
    board = FakeDaemon("board-0")
    with _client([board], None) as client:
        r = client.post("/v1/completions", json=COMPLETION, headers={"x-request-id": "req-1"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "req-1"
        unnamed = client.post("/v1/completions", json=COMPLETION)
    assert [s.metadata for s in board.submitted] == [
        (("x-request-id", "req-1"),),
        (("x-request-id", unnamed.headers["x-request-id"]),),
    ]


def test_spans_follow_the_request_and_each_attempt_carries_its_own_context() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    plan = [2]  # whichever board gets the job first dies after 2 tokens: a failover to the other
    dying, spare = FakeDaemon("board-0", die_plan=plan), FakeDaemon("board-1", die_plan=plan)
    headers = {"x-request-id": "req-2", "traceparent": f"00-{TRACE_ID:032x}-00f067aa0ba902b7-01"}
    with _client([dying, spare], provider) as client:
        r = client.post("/v1/completions", json={**COMPLETION, "stream": True}, headers=headers)
        assert r.status_code == 200
    spans = exporter.get_finished_spans()
    (request_span,) = [s for s in spans if s.kind is SpanKind.SERVER]
    attempts = [s for s in spans if s.name == "calculet.submit"]
    assert request_span.context.trace_id == TRACE_ID
    assert len(attempts) == len(dying.submitted) + len(spare.submitted) == 2
    assert all(a.parent is not None and a.parent.span_id == request_span.context.span_id for a in attempts)
    sent = [dict(s.metadata) for s in dying.submitted + spare.submitted]
    assert all(m["x-request-id"] == "req-2" for m in sent)
    assert sorted(m["traceparent"].split("-")[2] for m in sent) == sorted(f"{a.context.span_id:016x}" for a in attempts)
    assert [a.status.is_ok for a in sorted(attempts, key=lambda a: a.start_time or 0)][-1], (
        "the last attempt ended well"
    )
