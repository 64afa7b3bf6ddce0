"""The timing-model limit against values worked out by hand from the table of timing_factories.py.

A request of prompt 10 and output 3 (rows 1, batch 1): prefill copies 10 ms in + 2 ms out = 12 ms;
prefill compute 5 + 10 + 0.1 * (1 + ... + 10) = 20.5 ms; two decode steps at KV 11 and 12: 11.1 +
11.2 = 22.3 ms, plus 3 ms of copies each. At 2 rows (batch 2, factor 1.5): decode 33.45 ms, copies
6 ms a step.
"""

from __future__ import annotations

import pytest

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.limit import (
    Policy,
    RequestShape,
    Serving,
    decode_sum_ms,
    limits_by_batch,
    request_floor,
    rows_at_load,
    workload_limit,
)

from .timing_factories import TIMING, device_model

CONT1 = Serving(Policy.CONTINUOUS, 1)
CONT2 = Serving(Policy.CONTINUOUS, 2)
SERIAL = Serving(Policy.SERIAL, 2)


def test_one_request_alone() -> None:
    floor = request_floor(device_model(), RequestShape(10, 3), rows=1)
    assert floor.prefill_copies == pytest.approx(0.012)
    assert floor.prefill_compute == pytest.approx(0.0205)
    assert floor.decode_steps == 2
    assert floor.decode_compute == pytest.approx(0.0223)
    assert floor.decode_copies == pytest.approx(0.006)
    assert floor.ttft == pytest.approx(0.0325)
    assert floor.step == pytest.approx(0.01415)
    assert floor.e2e == pytest.approx(0.0608)


def test_a_one_token_request_has_no_decode_step() -> None:
    floor = request_floor(device_model(), RequestShape(10, 1), rows=1)
    assert (floor.decode_steps, floor.decode_compute, floor.step) == (0, 0.0, None)
    assert floor.e2e == pytest.approx(0.0325)


def test_rows_share_a_wider_batch() -> None:
    floor = request_floor(device_model(), RequestShape(10, 3), rows=2)
    assert floor.decode_compute == pytest.approx(0.03345)  # 22.3 ms x (1 + 0.5)
    assert floor.decode_copies == pytest.approx(0.012)  # 2 rows x 3 ms, 2 steps


def test_the_curve_is_flat_above_its_last_point() -> None:
    assert decode_sum_ms(TIMING, 1, 99, 3) == pytest.approx(60.0)  # KV 100, 101, 102: 20 ms each
    assert decode_sum_ms(TIMING, 2, 99, 3) == pytest.approx(90.0)
    assert decode_sum_ms(TIMING, 1, 5, 0) == 0.0


def test_in_flight_1_adds_every_phase_and_in_flight_2_is_compute_bound() -> None:
    shapes = [RequestShape(10, 3)] * 2
    one = workload_limit(device_model(), shapes, CONT1, rows=2)
    # per request: 32.5 ms to the first token + (33.45 + 12) / 2 ms of shared decode steps
    assert one.serial_s == pytest.approx(0.11045)
    assert one.compute_s == pytest.approx(0.07445)  # 2 x (20.5 + 33.45 / 2) ms
    assert one.chain_s == pytest.approx(0.04545)  # 2 x (33.45 + 12) / 2 ms
    assert one.device_s == pytest.approx(0.11045)
    assert one.overlap_s == pytest.approx(0.0)
    two = workload_limit(device_model(), shapes, CONT2, rows=2)
    assert two.device_s == pytest.approx(0.07445)
    assert two.overlap_s == pytest.approx(0.036)
    assert (two.rows, two.batch, two.requests, two.output_tokens) == (2, 2, 2, 6)
    assert two.output_tokens_per_s == pytest.approx(6 / 0.07445)
    assert two.s_per_request == pytest.approx(0.037225)
    assert two.s_per_output_token == pytest.approx(0.07445 / 6)


def test_in_flight_2_is_chain_bound_when_decode_copies_outweigh_prefills() -> None:
    # prompt 1, output 11: prefill 5 + 1 + 0.1 = 6.1 ms; ten steps at KV 2..11: 100 + 0.1 x 65 = 106.5 ms,
    # each step's 3 ms of copies in the chain (the next step needs this one's token)
    limit = workload_limit(device_model(), [RequestShape(1, 11)], CONT2, rows=1)
    assert limit.compute_s == pytest.approx(0.1126)
    assert limit.chain_s == pytest.approx(0.1365)
    assert limit.device_s == pytest.approx(0.1365)
    assert limit.serial_s == pytest.approx(0.1456)  # + 1 ms in, 2 ms out for the prefill


def test_serial_is_one_row_in_flight_1() -> None:
    model = device_model()
    assert SERIAL.inflight == 1 and SERIAL.rows(model, 8) == 1
    (only,) = limits_by_batch(model, [RequestShape(10, 3)], SERIAL)
    assert (only.rows, only.batch, only.inflight) == (1, 1, 1)
    assert only.device_s == pytest.approx(0.0608)


def test_limits_by_batch_fill_each_batch_up_to_the_lanes() -> None:
    model = device_model(batches=(1, 2, 4), lanes=2)
    limits = limits_by_batch(model, [RequestShape(10, 3)], CONT1)
    assert [(x.rows, x.batch) for x in limits] == [(1, 1), (2, 2), (2, 2)]


def test_rows_and_batches_at_a_load() -> None:
    model = device_model(batches=(1, 4), lanes=4)
    assert CONT2.rows(model, 3) == 3 and model.batch_for(3) == 4
    assert CONT2.rows(model, 9) == 4 and model.batch_for(9) == 4
    assert rows_at_load(model, CONT2, 3.0, boards=2) == 2
    assert rows_at_load(model, CONT2, 0.5, boards=4) == 1
    assert rows_at_load(device_model(lanes=2), CONT2, 16.0, boards=1) == 2


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Serving(Policy.CONTINUOUS, 3), "max_inflight: must be 1 or 2, got 3"),
        (lambda: RequestShape(0, 4), "prompt and output must be >= 1, got 0/4"),
        (lambda: workload_limit(device_model(), [], CONT1, 1), "at least one request"),
        (lambda: workload_limit(device_model(), [RequestShape(1, 1)], CONT1, 3), "rows: must be in 1..2"),
        (lambda: CONT1.rows(device_model(), 0), "concurrency: must be at least 1"),
        (lambda: rows_at_load(device_model(), CONT1, 1.0, 0), "boards: must be at least 1"),
        (lambda: device_model(batches=(4, 1)), "distinct, ascending"),
        (lambda: device_model(lanes=0), "must be at least 1"),
    ],
)
def test_bad_inputs_are_refused(call: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace(".", r"\.")):
        call()  # type: ignore[operator]
