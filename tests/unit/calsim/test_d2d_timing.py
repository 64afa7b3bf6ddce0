"""calsim's cross-chip (D2D) time: a package declaring `topology.d2d` pays its syncs and bytes inside
the compute phase (per compiled row of a decode, per new token of a prefill), the device reports
them in the job's timestamps, and a package without it pays nothing (docs/package.md `topology.d2d`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from calculet.daemon.calsim import timing
from calculet.daemon.calsim.device import CalsimDevice
from calculet.daemon.device.types import RowSpec, TaskType
from calculet.daemon.package.manifest import D2DDecl

from .factories import DECODE4, PREFILL, TIMING, make_bufs, make_manifest, prefill_spec
from .factories import decode_spec as decode_job

LINK = D2DDecl(bytes_per_token=1_000_000, syncs_per_job=100, link_gbps=10.0, sync_us=5.0)


def test_decode_moves_every_compiled_row_and_prefill_its_new_tokens() -> None:
    rows = [RowSpec(0, 7, 1), RowSpec(1, 3, 1)]
    assert timing.d2d_bytes(LINK, TaskType.DECODE, 4, rows) == 4 * 1_000_000  # masked rows move too
    prefill = [RowSpec(0, 0, 12), RowSpec(1, 40, 5)]
    assert timing.d2d_bytes(LINK, TaskType.PREFILL, 2, prefill) == 17 * 1_000_000  # dynamic: the tokens fed


def test_link_time_is_syncs_plus_bytes_over_the_rate() -> None:
    assert timing.d2d_s(LINK, 2_000_000) == pytest.approx(100 * 5e-6 + 2_000_000 / 10e9, rel=1e-12)
    assert timing.d2d_s(replace(LINK, syncs_per_job=0), 0) == 0.0


def test_job_durations_add_the_link_to_compute_and_report_it() -> None:
    rows = [RowSpec(0, 0, 12)]
    bare = timing.job_durations(TIMING, TaskType.PREFILL, 1, rows, 96, 1024)
    linked = timing.job_durations(TIMING, TaskType.PREFILL, 1, rows, 96, 1024, LINK)
    link = timing.d2d_s(LINK, 12_000_000)
    assert (bare.d2d, bare.d2d_bytes) == (0.0, 0)
    assert (linked.d2d, linked.d2d_bytes) == (pytest.approx(link, rel=1e-12), 12_000_000)
    assert linked.compute == pytest.approx(bare.compute + link, rel=1e-12)
    assert (linked.h2d, linked.d2h) == (bare.h2d, bare.d2h)  # the host copies do not cross chips


def test_a_slower_link_or_more_syncs_costs_more() -> None:
    rows = [RowSpec(0, 5, 1)]
    base = timing.job_durations(TIMING, TaskType.DECODE, 4, rows, 8, 8, LINK).compute
    assert timing.job_durations(TIMING, TaskType.DECODE, 4, rows, 8, 8, replace(LINK, link_gbps=5.0)).compute > base
    assert timing.job_durations(TIMING, TaskType.DECODE, 4, rows, 8, 8, replace(LINK, syncs_per_job=101)).compute > base


def test_device_reports_the_jobs_d2d_in_its_timestamps(device: CalsimDevice, tmp_path: Path) -> None:
    m = make_manifest()
    model = device.configure(tmp_path, replace(m, topology=replace(m.topology, d2d=LINK)))
    pre = make_bufs(device, model, PREFILL)
    sub = device.submit(model, prefill_spec(pre, 0, [3, 4, 5]))
    sub.wait(5)
    ts = sub.timestamps()
    assert ts is not None
    assert ts.d2d_bytes == 3 * LINK.bytes_per_token
    assert ts.d2d_seconds == pytest.approx(timing.d2d_s(LINK, 3 * LINK.bytes_per_token), rel=1e-12)
    assert ts.compute == pytest.approx(timing.prefill_ms(TIMING, 3, 0) / 1000 + ts.d2d_seconds, rel=1e-9)
    dec = make_bufs(device, model, DECODE4)
    step = device.submit(model, decode_job(dec, [(0, 3, 1)]))
    step.wait(5)
    stamps = step.timestamps()
    assert stamps is not None and stamps.d2d_bytes == 4 * LINK.bytes_per_token  # compiled batch 4, one row active


def test_a_package_without_d2d_reports_none(device: CalsimDevice, tmp_path: Path) -> None:
    model = device.configure(tmp_path, make_manifest())
    sub = device.submit(model, prefill_spec(make_bufs(device, model, PREFILL), 0, [3, 4, 5]))
    sub.wait(5)
    ts = sub.timestamps()
    assert ts is not None and (ts.d2d_seconds, ts.d2d_bytes) == (0.0, 0)
