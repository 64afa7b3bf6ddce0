"""The daemon's metrics over a real in-process board (DeviceCore + calsim, no gRPC, no HTTP):
requests move the request, token, latency, per-phase and busy-ratio metrics by exactly the right
amounts, and agree with Status; lanes and running requests show while a request runs; device
faults are counted by kind; observers never run on an engine thread or under the engine lock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from calculet.common.telemetry.registry import CONTENT_TYPE
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.observe.observer import DeviceJobDone, EngineObserver, RequestFinished
from calculet.daemon.telemetry.daemon_metrics import DaemonMetrics
from tests.unit.core.engine_factories import (
    OwnerLock,
    build_models,
    finish,
    generate_all,
    request,
    running_core,
    track_engine_lock,
    until,
)
from tests.unit.telemetry.scrape import Scrape, delta

WAIT_S = 20.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models(tmp_path_factory.mktemp("models"))


@contextmanager
def metered_core(models: Path, **overrides: Any) -> Iterator[tuple[DeviceCore, DaemonMetrics]]:
    made: list[DaemonMetrics] = []
    with running_core(models, before_start=lambda core: made.append(DaemonMetrics(core)), **overrides) as core:
        yield core, made[0]
    made[0].close()


def scrape(core: DeviceCore, metrics: DaemonMetrics) -> Scrape:
    assert core.engine.flush_observers(WAIT_S)
    body, content_type = metrics.render()
    assert content_type == CONTENT_TYPE
    return Scrape(body.decode())


PROMPTS = ((5, 6, 7), (1, 2, 3, 4, 5), tuple(range(10, 18)))
MAX_TOKENS = (4, 6, 9)


def test_requests_move_every_metric_by_the_right_amount(models: Path) -> None:
    with metered_core(models) as (core, metrics):
        before, status0 = scrape(core, metrics), core.status()
        generate_all(core, [request(p, n, seed=i) for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True))])
        after, status1 = scrape(core, metrics), core.status()

    n = len(PROMPTS)
    assert delta(after, before, "calculet_requests_total", model="tiny", finish="length") == n
    assert delta(after, before, "calculet_prompt_tokens_total", model="tiny") == sum(map(len, PROMPTS))
    assert delta(after, before, "calculet_generation_tokens_total", model="tiny") == sum(MAX_TOKENS)
    for name in ("time_to_first_token", "e2e_request_latency", "queue_time", "time_per_output_token"):
        assert delta(after, before, f"calculet_{name}_seconds_count", model="tiny") == n, name
    assert delta(after, before, "calculet_inter_token_latency_seconds_count") == sum(MAX_TOKENS) - n
    # One observation per phase per device job, as the device counted them.
    jobs = status1.device_counters.finished - status0.device_counters.finished
    assert jobs >= n + max(MAX_TOKENS) - 1  # a prefill each, then (batched) decode steps
    for phase in ("h2d", "compute", "d2h", "sampling", "postprocess"):
        assert delta(after, before, "calculet_job_phase_seconds_count", phase=phase) == jobs, phase
    assert delta(after, before, "calculet_device_jobs_finished_total") == jobs
    # Busy ratio: the gauges are Status's figures; compute is the union of compute intervals.
    u0, u1 = status0.utilization, status1.utilization
    assert u1.generated_tokens - u0.generated_tokens == sum(MAX_TOKENS)
    assert after.one("calculet_device_busy_ratio") == pytest.approx(u1.busy_ratio)
    assert 0 < u1.busy_ratio <= 1 and u1.busy_seconds <= u1.device_seconds
    assert after.one("calculet_device_busy_seconds_total") == pytest.approx(u1.busy_seconds)
    assert after.one("calculet_device_clock_seconds_total") == pytest.approx(u1.device_seconds)
    assert delta(after, before, "calculet_job_phase_seconds_sum", phase="compute") == pytest.approx(
        u1.compute_seconds - u0.compute_seconds
    )
    banks = {b["bank"]: after.one("calculet_engine_busy_seconds_total", **b) for b in
             after.labels("calculet_engine_busy_seconds_total")}  # fmt: skip
    assert set(banks) == {"ping", "pong"} and sum(banks.values()) == pytest.approx(u1.busy_seconds)
    assert after.one("calculet_kv_lanes_used", model="tiny", generation="1") == 0
    assert after.one("calculet_kv_lanes_total", model="tiny", generation="1") == len(status1.models[0].lanes)
    assert after.one("calculet_model_state", model="tiny", state="ready") == 1
    assert after.one("calculet_model_generation", model="tiny") == 1
    info = after.labels("calculet_build_info")[0]
    assert info["runtime"] == status1.device.runtime_version and info["firmware"] == status1.device.firmware_version
    assert after.labels("calculet_model_info")[0]["calbin_hash"] == status1.models[0].package_hash != ""


def test_lanes_and_running_requests_show_while_a_request_runs(models: Path) -> None:
    # Time scale 1: the modelled board takes its real time, so the request is still running while polled.
    with metered_core(models, device_options={"time_scale": 1.0}) as (core, metrics):
        job = core.submit(request((1, 2, 3), 250, seed=1)).job_id  # ~7 s of modelled decode

        def lanes_used() -> float:
            return scrape(core, metrics).one("calculet_kv_lanes_used", model="tiny", generation="1")

        until("the request holds a lane", lambda: lanes_used() == 1, WAIT_S)
        s = scrape(core, metrics)
        assert s.one("calculet_requests_running", model="tiny") == 1
        assert s.one("calculet_kv_lane_usage_ratio", model="tiny", generation="1") == pytest.approx(
            1 / s.one("calculet_kv_lanes_total", model="tiny", generation="1")
        )
        core.cancel(job)
        finish(core, job)
        until("the lane is free again", lambda: lanes_used() == 0, WAIT_S)
        s = scrape(core, metrics)
        assert s.one("calculet_requests_running", model="tiny") == 0
        assert s.one("calculet_requests_total", model="tiny", finish="cancelled") == 1


@pytest.mark.parametrize(
    ("fault", "kind"), [(FaultKind.NAN_LOGITS, "non_finite_logits"), (FaultKind.CCU_EXCEPTION, "ccu_exception")]
)
def test_device_faults_are_counted_by_kind(models: Path, fault: FaultKind, kind: str) -> None:
    with metered_core(models, fault_injection=True) as (core, metrics):
        core.inject_fault(Fault(fault))  # the next device job
        _, final = finish(core, core.submit(request((1, 2, 3), 5, seed=1)).job_id)
        s = scrape(core, metrics)
    assert final.reason.value == "length"  # recovered by a re-prefill
    assert s.one("calculet_faults_total", kind=kind) == 1
    assert s.one("calculet_recoveries_total") == 1


def test_observers_run_on_their_own_thread_never_under_the_engine_lock(models: Path) -> None:
    class LockProbe(EngineObserver):
        def __init__(self) -> None:
            self.lock: OwnerLock | None = None
            self.seen: list[tuple[bool, str]] = []  # (engine lock held here, thread name) per event
            self.jobs = 0

        def device_job_done(self, event: DeviceJobDone) -> None:
            self._note()
            self.jobs += 1

        def request_finished(self, event: RequestFinished) -> None:
            self._note()

        def _note(self) -> None:
            assert self.lock is not None
            self.seen.append((self.lock.held_here(), threading.current_thread().name))

    probe = LockProbe()

    def before_start(core: DeviceCore) -> None:
        probe.lock = track_engine_lock(core)
        core.engine.add_observer(probe)

    with running_core(models, before_start=before_start) as core:
        generate_all(core, [request(p, 4, seed=1) for p in PROMPTS])
        assert core.engine.flush_observers(WAIT_S)
        assert probe.jobs == core.status().device_counters.finished  # warm-up included: added before start
    assert probe.seen and set(probe.seen) == {(False, "calculet-observers")}
