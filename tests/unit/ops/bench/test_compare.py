"""`calctl bench compare`'s report (`ops/bench/compare.py`) from hand-made run records: each side's
figures, the verdict by goodput (a lead above the margin wins, below it the runs tie, a side without
goodput gives no verdict), the Markdown table; the timing-model limit charging a package's declared
cross-chip traffic as calsim does; and the board-time SLO scaled to wall milliseconds."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from calculet.common.errors import InvalidArgument
from calculet.daemon.calsim.timing import d2d_s
from calculet.daemon.package.manifest import D2DDecl, PackageManifest
from calculet.ops.bench.compare import compare_json, markdown, side_json, verdict
from calculet.ops.bench.limit import RequestShape, request_floor
from calculet.ops.commands.bench_compare import _slo_scaled
from tests.unit.package.conftest import valid_manifest

from .timing_factories import device_model

LINK = D2DDecl(1_000_000, syncs_per_job=10, link_gbps=10.0, sync_us=100.0)


def manifest(parallelism: str, d2d: D2DDecl | None) -> PackageManifest:
    m = valid_manifest()
    return dataclasses.replace(m, topology=dataclasses.replace(m.topology, parallelism=parallelism, d2d=d2d))


def record(
    goodput: float | None, error: str | None = None, d2d_s: float = 0.5, d2d_bytes: int = 8_000
) -> dict[str, Any]:
    report = {
        "counts": {"completed": 4, "failed": 0, "output_tokens": 100},
        "throughput": {"output_tokens_per_s": 50.0},
        "timing_model": {"limit": {"output_tokens_per_s": 60.0}},
        "goodput": None if goodput is None else {"output_tokens_per_s": goodput, "requests_per_s": 1.5,
                                                  "good_requests": 3},
        "latency_ms": {"ttft": {"p50": 10.0, "p99": 20.0}, "tpot": {"p50": 2.0, "p99": 3.0}},
        "device": {"busy_ratio": 0.9, "boards": [{"phases_s": {"compute": 2.0}, "device_s": 4.0,
                                                  "generated_tokens": 120,
                                                  "d2d": {"seconds": d2d_s, "bytes": d2d_bytes}}]},
    }  # fmt: skip
    return {"report": report, "error": error, "time_scale": 1.0, "package_path": "/p"}


def test_a_side_carries_its_declared_split_and_its_measured_figures() -> None:
    side = side_json("A", manifest("ep", LINK), record(40.0))
    assert (side["parallelism"], side["d2d_bytes_per_token"], side["d2d_syncs_per_job"]) == ("ep", 1_000_000, 10)
    assert (side["goodput_tokens_per_s"], side["good_requests"], side["tpot_ms"]) == (40.0, 3, {"p50": 2.0, "p99": 3.0})
    assert side["d2d_share_of_compute"] == 0.25 and side["d2d_bytes_per_output_token"] == 80.0
    assert side["device_tokens_per_s"] == 30.0  # 120 tokens in 4 s of the board's own clock
    assert side["limit_tokens_per_s"] == 60.0
    bare = side_json("B", manifest("tp", None), {"report": None, "error": "the fleet failed"})
    assert bare["d2d_bytes_per_token"] is None and bare["goodput_tokens_per_s"] is None and bare["busy_ratio"] is None


def test_the_higher_goodput_wins_beyond_the_margin_and_ties_within_it() -> None:
    a, b = side_json("A", manifest("tp", LINK), record(100.0)), side_json("B", manifest("ep", LINK), record(110.0))
    won = verdict(a, b, 0.02)
    assert won["winner"] == "B" and won["ratio"] == pytest.approx(1.1) and "+10.0%" in won["reason"]
    assert verdict(b, a, 0.02)["winner"] == "B"  # whichever side it is on
    close = verdict(a, side_json("B", manifest("ep", LINK), record(101.0)), 0.02)
    assert close["winner"] is None and close["reason"].startswith("tie")


def test_a_win_the_device_clock_does_not_back_carries_a_caution() -> None:
    a = side_json("A", manifest("tp", LINK), record(100.0))
    b = side_json("B", manifest("ep", LINK), record(120.0))
    assert a["device_tokens_per_s"] == b["device_tokens_per_s"]  # the same modelled pace: the host decided
    noisy = verdict(a, b, 0.02)
    assert noisy["winner"] == "B" and "device clock does not back it" in noisy["caution"]
    assert "Caution: the device clock" in markdown(compare_json({}, [a, b]))
    faster = {**b, "device_tokens_per_s": 1.1 * a["device_tokens_per_s"]}
    assert verdict(a, faster, 0.02)["caution"] is None


def test_no_verdict_without_goodput_on_both_sides() -> None:
    a = side_json("A", manifest("tp", LINK), record(100.0))
    assert verdict(a, side_json("B", manifest("ep", LINK), record(None)))["winner"] is None
    failed = verdict(a, side_json("B", manifest("ep", LINK), record(120.0, error="1 request(s) failed")))
    assert failed["winner"] is None and "B" in failed["reason"]
    zero = verdict(a, side_json("B", manifest("ep", LINK), record(0.0)))
    assert zero["winner"] == "A" and "met the SLO on no request" in zero["reason"]


def test_markdown_puts_both_sides_side_by_side_with_the_verdict() -> None:
    slower = {**side_json("B", manifest("ep", None), record(50.0)), "device_tokens_per_s": 15.0}
    sides = [side_json("A", manifest("tp", LINK), record(100.0)), slower]
    text = markdown(compare_json({"workload": "w"}, sides))
    assert "| parallelism | tp | ep |" in text
    assert "| declared D2D bytes/token, syncs/job | 1,000,000, 10 | none |" in text
    assert "| goodput output tokens/s | 100.0 | 50.0 |" in text
    assert text.rstrip().endswith("A (tp): goodput +100.0% over B (ep).")


def test_the_limit_charges_the_declared_link_inside_the_compute() -> None:
    plain = device_model()
    linked = dataclasses.replace(plain, d2d=LINK)
    a, b = request_floor(plain, RequestShape(10, 3), rows=2), request_floor(linked, RequestShape(10, 3), rows=2)
    assert b.prefill_compute == pytest.approx(a.prefill_compute + d2d_s(LINK, 10 * LINK.bytes_per_token))
    step = d2d_s(LINK, 2 * LINK.bytes_per_token)  # batch 2: every compiled row crosses
    assert b.decode_compute == pytest.approx(a.decode_compute + 2 * step)
    assert (b.prefill_copies, b.decode_copies) == (a.prefill_copies, a.decode_copies)


def test_the_slo_is_given_in_board_milliseconds() -> None:
    assert _slo_scaled("ttft:3000,tpot:100", 0.5) == "ttft:1500,tpot:50"
    with pytest.raises(InvalidArgument):
        _slo_scaled("ttft:0", 1.0)
    with pytest.raises(InvalidArgument):
        _slo_scaled("ttft", 1.0)
