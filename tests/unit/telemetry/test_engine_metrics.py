"""`EngineMetrics`: engine events -> Prometheus samples, exactly (no engine, no process): requests,
tokens and request latencies from the Final's usage and timings, inter-token latency from row
times, per-phase device times, batch fill, refusals, resets and faults; warm-up probes stay out of
the request metrics; a finished request leaves no state behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from calculet.common.errors import ErrorKind
from calculet.common.telemetry.registry import MetricsRegistry
from calculet.daemon.core.audit import AuditEntry, operator_entry
from calculet.daemon.core.events import FinishReason, Timings, Usage
from calculet.daemon.core.observe.observer import (
    DeviceJobDone,
    FaultSeen,
    RequestFinished,
    RequestRejected,
    ResetRecorded,
    RowDone,
)
from calculet.daemon.device.types import EngineSlot, JobStatus, JobTimestamps, TaskType
from calculet.daemon.telemetry.engine_metrics import EngineMetrics
from tests.unit.telemetry.scrape import Scrape

STAMPS = JobTimestamps(0.0, 0.0, 0.001, 0.001, 0.021, 0.021, 0.0215)  # h2d 1 ms, compute 20 ms, d2h 0.5 ms


@pytest.fixture
def metrics() -> Iterator[tuple[EngineMetrics, MetricsRegistry]]:
    registry = MetricsRegistry("test")
    yield EngineMetrics(registry.meter), registry
    registry.close()


def job(
    task: TaskType, rows: tuple[RowDone, ...], t_done: float, *, batch: int = 4, faults: tuple[str, ...] = ()
) -> DeviceJobDone:
    status = JobStatus.CCU_EXCEPTION if faults else JobStatus.DONE
    return DeviceJobDone(
        7, task, EngineSlot.PING, "m", 1, status, rows, batch, STAMPS, 0.0003, 0.0001, t_done - 0.03, t_done, faults
    )


def finished(job_id: str, *, internal: bool = False, kind: ErrorKind | None = None) -> RequestFinished:
    reason = FinishReason.ERROR if kind else FinishReason.LENGTH
    usage = Usage(prompt_tokens=7, completion_tokens=5, resumed_tokens=1)  # 4 tokens made here
    timings = Timings(queue=0.01, prefill=0.01, ttft=0.02, decode=0.09, e2e=0.11)
    return RequestFinished(job_id, "m", 1, reason, kind, usage, timings, internal, 1.0)


def test_a_request_s_tokens_latencies_and_phases(metrics: tuple[EngineMetrics, MetricsRegistry]) -> None:
    em, registry = metrics
    a = RowDone("a", token=True, first=True, internal=False)
    probe = RowDone("p", token=True, first=True, internal=True)
    em.device_job_done(job(TaskType.PREFILL, (a,), 10.0, batch=1))
    em.device_job_done(job(TaskType.PREFILL, (probe,), 10.01, batch=1))
    later = RowDone("a", token=True, first=False, internal=False)
    for t in (10.05, 10.08, 10.1):  # ITL 50, 30, 20 ms
        em.device_job_done(job(TaskType.DECODE, (later, RowDone("p", True, False, True)), t))
    em.request_finished(finished("a"))
    em.request_finished(finished("p", internal=True))
    s = Scrape(registry.render().decode())

    assert s.one("calculet_requests_total", model="m", finish="length") == 1
    assert s.value("calculet_requests_total") == 1  # the probe is not a request
    assert s.one("calculet_prompt_tokens_total", model="m") == 7
    assert s.one("calculet_generation_tokens_total", model="m") == 4  # the probe's 4 tokens are not counted
    assert s.one("calculet_time_to_first_token_seconds_count", model="m") == 1
    assert s.one("calculet_time_to_first_token_seconds_sum", model="m") == pytest.approx(0.02)
    assert s.one("calculet_time_per_output_token_seconds_sum", model="m") == pytest.approx(0.09 / 3)
    assert s.one("calculet_e2e_request_latency_seconds_sum", model="m") == pytest.approx(0.11)
    assert s.one("calculet_queue_time_seconds_sum", model="m") == pytest.approx(0.01)
    assert s.one("calculet_inter_token_latency_seconds_count", model="m") == 3
    assert s.one("calculet_inter_token_latency_seconds_sum", model="m") == pytest.approx(0.1)
    assert s.one("calculet_inter_token_latency_seconds_bucket", model="m", le="0.02") == 1  # fine ms buckets
    assert s.one("calculet_inter_token_latency_seconds_bucket", model="m", le="0.03") == 2
    # Five device jobs (two prefills, three decodes), probes included: the device did the work.
    for phase, seconds in (("h2d", 0.001), ("compute", 0.02), ("d2h", 0.0005), ("sampling", 0.0003)):
        assert s.one("calculet_job_phase_seconds_count", phase=phase, task="prefill") == 2
        assert s.one("calculet_job_phase_seconds_count", phase=phase, task="decode") == 3
        assert s.value("calculet_job_phase_seconds_sum", phase=phase) == pytest.approx(5 * seconds)
    assert s.one("calculet_batch_fill_ratio_count") == 3  # decode jobs only: 2 rows of 4
    assert s.one("calculet_batch_fill_ratio_sum") == pytest.approx(1.5)
    assert s.types["calculet_time_to_first_token_seconds"] == "histogram"
    assert s.types["calculet_requests"] == "counter"


def test_a_finished_request_leaves_no_state(metrics: tuple[EngineMetrics, MetricsRegistry]) -> None:
    em, registry = metrics
    em.device_job_done(job(TaskType.PREFILL, (RowDone("a", True, True, False),), 10.0, batch=1))
    em.request_finished(finished("a"))
    # A late row of the same id (it cannot happen after a Final) starts afresh: no ITL from stale state.
    em.device_job_done(job(TaskType.DECODE, (RowDone("a", True, False, False),), 99.0))
    assert Scrape(registry.render().decode()).value("calculet_inter_token_latency_seconds_count") == 0


def test_errors_refusals_resets_and_faults(metrics: tuple[EngineMetrics, MetricsRegistry]) -> None:
    em, registry = metrics
    em.request_finished(finished("a", kind=ErrorKind.UNAVAILABLE))
    for reason in ("queue_full", "queue_full", "admission_timeout"):
        em.request_rejected(RequestRejected("m", reason, 1.0))
    entry = AuditEntry(0.0, "ccu", True, "hung", "hang", 2, 0, 0, ("m@1",), (), True, False, False, "failed")
    em.reset_recorded(ResetRecorded(entry))
    streak = ("m@1",)
    drain = AuditEntry(0.0, "drain", True, "streak", "submit error streak", 1, 0, 1, streak, streak, True, False, True)
    em.reset_recorded(ResetRecorded(drain))
    for kind, reason in (("drain", "operator drain"), ("resume", "operator resume"), ("drain", "shutdown")):
        point = (True, streak)
        em.reset_recorded(ResetRecorded(operator_entry(kind, reason, point, point, "by hand")))
    em.fault_seen(FaultSeen("hang", "job 3 hung", 1.0))
    em.device_job_done(job(TaskType.DECODE, (RowDone("b", False, False, False),), 5.0, faults=("ccu_exception",)))
    s = Scrape(registry.render().decode())
    assert s.one("calculet_requests_total", model="m", finish="error") == 1
    assert s.one("calculet_request_errors_total", model="m", kind="unavailable") == 1
    assert s.one("calculet_admission_rejections_total", model="m", reason="queue_full") == 2
    assert s.one("calculet_admission_rejections_total", model="m", reason="admission_timeout") == 1
    assert s.one("calculet_device_resets_total", kind="ccu", reason="hang", result="failed") == 1
    assert s.one("calculet_escalations_total", kind="drain", reason="submit error streak") == 1
    assert s.value("calculet_device_resets_total") == 1, "an escalation that reset nothing is not a reset"
    assert s.value("calculet_escalations_total") == 1, "an operator's drain is no escalation"
    assert s.one("calculet_board_drains_total", action="drain", reason="operator drain") == 1
    assert s.one("calculet_board_drains_total", action="resume", reason="operator resume") == 1
    assert s.one("calculet_board_drains_total", action="drain", reason="shutdown") == 1
    assert s.one("calculet_faults_total", kind="hang") == 1
    assert s.one("calculet_faults_total", kind="ccu_exception") == 1
    assert s.value("calculet_generation_tokens_total") == 0  # a faulted row streams nothing
