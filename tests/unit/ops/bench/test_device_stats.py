"""Device figures over a run: after - before of each board's cumulative utilisation, the busy ratio
as d(busy)/d(device) per board and over the fleet, n/a (an error, no figures) when a board cannot be
read or reports no utilisation; and the protobuf conversion."""

from __future__ import annotations

import asyncio

import pytest

from calculet.common.errors import PermissionDenied
from calculet.ops.bench.device_stats import (
    BoardSample,
    BoardVersions,
    ModelVersion,
    UtilizationSample,
    board_utilization,
    fleet_busy_ratio,
    sample_boards,
)
from calculet.ops.bench.wire_views import utilization_sample
from calculet.v1 import observe_pb2

from .factories import sample


def test_a_board_over_the_run_is_the_difference_of_its_samples() -> None:
    before = BoardSample("b0", sample(10.0, 6.0, [(0, 4.0), (1, 2.0)], tokens=100))
    after = BoardSample("b0", sample(14.0, 9.0, [(0, 5.0), (1, 4.0)], tokens=160))
    board = board_utilization(before, after)
    assert board.error is None
    assert board.device_s == pytest.approx(4.0) and board.busy_s == pytest.approx(3.0)
    assert board.busy_ratio == pytest.approx(3.0 / 4.0)  # not the cumulative 9/14
    assert board.banks == ((0, pytest.approx(1.0), pytest.approx(0.25)), (1, pytest.approx(2.0), pytest.approx(0.5)))
    assert board.generated_tokens == 60
    assert board.h2d_s == pytest.approx((14.0 - 10.0) / 10)
    assert board.d2h_s == pytest.approx((14.0 - 10.0) / 20)
    assert board.compute_s == pytest.approx(3.0) and board.sampling_s == pytest.approx(3.0 / 4)


def test_a_device_clock_that_did_not_move_has_no_ratio() -> None:
    still = BoardSample("b0", sample(5.0, 2.0))
    board = board_utilization(still, still)
    assert board.busy_ratio is None and board.device_s == 0.0


def test_the_fleet_ratio_weighs_boards_by_their_device_time_and_skips_unread_ones() -> None:
    b0 = board_utilization(BoardSample("b0", sample(0.0, 0.0)), BoardSample("b0", sample(2.0, 1.0)))
    b1 = board_utilization(BoardSample("b1", sample(0.0, 0.0)), BoardSample("b1", sample(4.0, 3.0)))
    gone = board_utilization(BoardSample("b2", None, "unavailable: down"), BoardSample("b2", sample(9.0, 9.0)))
    assert gone.error == "unavailable: down" and gone.busy_ratio is None and gone.device_s is None
    assert fleet_busy_ratio([b0, b1, gone]) == pytest.approx((1.0 + 3.0) / (2.0 + 4.0))
    assert fleet_busy_ratio([gone]) is None


def test_boards_that_cannot_be_read_or_report_nothing_are_errors_not_numbers() -> None:
    async def status_of(target: str) -> UtilizationSample | None:
        if target == "denied":
            raise PermissionDenied("Status needs the observe token")
        return None if target == "old" else sample(1.0, 0.5)

    got = asyncio.run(sample_boards(["ok", "denied", "old"], status_of))
    assert got["ok"].sample is not None and got["ok"].error is None
    assert got["denied"].error == "permission_denied: Status needs the observe token"
    assert got["old"].error == "the daemon reports no device utilization (Status field 14)"


def test_status_protobuf_converts_and_a_daemon_without_the_field_gives_none() -> None:
    assert utilization_sample(observe_pb2.StatusResponse()) is None
    pb = observe_pb2.StatusResponse(
        utilization=observe_pb2.DeviceUtilization(
            device_seconds=8.0, busy_seconds=6.0, busy_ratio=0.75,
            banks=[observe_pb2.BankUtilization(bank=0, busy_seconds=4.0), observe_pb2.BankUtilization(bank=1,
                                                                                                  busy_seconds=2.0)],
            h2d_seconds=0.5, compute_seconds=6.0, d2h_seconds=0.25, sampling_seconds=1.5, generated_tokens=42,
        ),
        device=observe_pb2.DeviceInfo(runtime_version="1.0.0", driver_version="1.0.2", firmware_version="fw-3"),
        models=[observe_pb2.ModelStatus(alias="qwen", generation=2, package_name="qwen3", package_hash="ab",
                                        calbin_sha256="cd", compiler={"calcc": "1.2", "tvm": "e4f"})],
    )  # fmt: skip
    versions = BoardVersions(
        "1.0.0", "1.0.2", "fw-3", (ModelVersion("qwen", 2, "qwen3", "ab", "cd", (("calcc", "1.2"), ("tvm", "e4f"))),)
    )
    assert utilization_sample(pb) == UtilizationSample(
        device_s=8.0, busy_s=6.0, banks=((0, 4.0), (1, 2.0)), h2d_s=0.5, compute_s=6.0, d2h_s=0.25, sampling_s=1.5,
        generated_tokens=42, versions=versions,
    )  # fmt: skip
    assert versions.to_json()["models"][0] == {  # type: ignore[index]
        "alias": "qwen", "generation": 2, "package": "qwen3", "package_hash": "ab", "calbin_sha256": "cd",
        "compiler": {"calcc": "1.2", "tvm": "e4f"},
    }  # fmt: skip
