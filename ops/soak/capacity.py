"""The arrival rate of the soak: `--load` times the fleet's capacity for the pool's mix.

The soak runs at `calibrated` capacity, measured; `modelled` is reported beside it at time scale > 0.

- Time scale > 0: the timing-model limit (`ops/bench/limit.py` on the package's
  `DeviceModel`): every pool request's shapes (`mix.request_shapes`: one per turn and choice) run
  once on one board at the saturation rows (`min(largest decode batch, lanes)`, continuous
  batching, in-flight 2) take `device_s` modelled seconds; the fleet completes `boards x pool /
  (device_s x time_scale)` arrivals per wall second. The typical end-to-end time (the client
  timeouts' unit) is the median modelled e2e floor of the shapes at those rows, times the scale.
- Measured (any time scale; at time scale 0 the device takes no wall time and the model says
  nothing): a short closed loop (`TrafficRunner.run_closed`, one client per lane of
  the fleet) measures arrivals per second, and the typical end-to-end time is the median of its
  completed non-streamed single requests.

The `long_context` kind (`mix`) is not in the calibrated mix: one such request holds a batch-1
board for many board-minutes (a 30,000-token prompt's modelled TTFT is about 17 minutes on the
qwen calbin), so a share of arrivals would either be lost in rounding or swamp the fleet. It comes
as a stream of its own (`long_context_rate`): Poisson arrivals that by the timing model take
`LONG_CONTEXT_TIME_SHARE` of the fleet's board time, whatever the time scale.

Pure except `calibrated`, which only packages the measurement.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.bench.limit import Policy, Serving, request_floor, workload_limit
from calculet.ops.soak.mix import RequestSpec, request_shapes

LONG_CONTEXT_TIME_SHARE = 0.10  # of the fleet's board time, by the timing model
CALIBRATION_SHARE = 0.05
MIN_CALIBRATION_S = 15.0
MAX_CALIBRATION_S = 120.0


@dataclass(frozen=True)
class SoakCapacity:
    """The rate the soak runs at, and where it came from.

    Attributes:
        method: "timing-model" or "calibrated".
        capacity_per_s: arrivals per second the fleet can take (conversations count once).
        load: the fraction asked for.
        typical_e2e_s: the unit of the `timeout` specs' client timeouts.
        detail: how it was computed (the limit's figures, or the calibration's).
    """

    method: str
    capacity_per_s: float
    load: float
    typical_e2e_s: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def rate_per_s(self) -> float:
        return self.load * self.capacity_per_s

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "capacity_arrivals_per_s": round(self.capacity_per_s, 4),
            "load": self.load,
            "rate_arrivals_per_s": round(self.rate_per_s, 4),
            "typical_e2e_s": round(self.typical_e2e_s, 4),
            **self.detail,
        }


def calibration_seconds(duration_s: float) -> float:
    """5 % of the run, within 15 s .. 120 s."""
    return min(MAX_CALIBRATION_S, max(MIN_CALIBRATION_S, CALIBRATION_SHARE * duration_s))


def long_context_rate(model: DeviceModel, specs: Sequence[RequestSpec], boards: int, wall_per_board: float) -> float:
    """Arrivals per wall second of the `long_context` stream (module docstring): the mean modelled
    end-to-end floor of `specs` (one board, alone) in board seconds, so that the stream takes
    `LONG_CONTEXT_TIME_SHARE` of `boards` boards' time; 0 without specs.

    Raises:
        ValueError: `wall_per_board` not > 0.
    """
    if not wall_per_board > 0:
        raise ValueError(f"long-context rate: wall seconds per board second must be > 0, got {wall_per_board}")
    if not specs:
        return 0.0
    board_s = statistics.fmean(sum(request_floor(model, s, 1).e2e for s in request_shapes(spec)) for spec in specs)
    return LONG_CONTEXT_TIME_SHARE * boards / (board_s * wall_per_board)


def modelled(
    model: DeviceModel, pool: Sequence[RequestSpec], boards: int, time_scale: float, load: float
) -> SoakCapacity:
    """The timing-model capacity (module docstring).

    Raises:
        ValueError: `time_scale` not > 0, or an empty pool.
    """
    if not time_scale > 0 or not pool:
        raise ValueError("the timing-model capacity needs a time scale > 0 and a pool")
    serving = Serving(Policy.CONTINUOUS, 2)
    rows = min(model.max_batch, model.lanes)
    shapes = [shape for spec in pool for shape in request_shapes(spec)]
    limit = workload_limit(model, shapes, serving, rows)
    capacity = boards * len(pool) / (limit.device_s * time_scale)
    typical = statistics.median(request_floor(model, s, rows).e2e for s in shapes) * time_scale
    detail = {
        "boards": boards,
        "time_scale": time_scale,
        "rows": rows,
        "decode_batch": limit.batch,
        "pool_requests": len(pool),
        "pool_device_shapes": len(shapes),
        "pool_device_s_per_board": round(limit.device_s, 4),
        "limit_output_tokens_per_s": round(boards * limit.output_tokens_per_s / time_scale, 3),
    }
    return SoakCapacity("timing-model", capacity, load, typical, detail)


def calibrated(
    arrivals_per_s: float, e2e_samples: Sequence[float], load: float, detail: dict[str, Any]
) -> SoakCapacity:
    """The measured capacity (module docstring); the typical e2e falls back to 1 s without samples.

    Raises:
        ValueError: nothing completed (a rate of 0).
    """
    if not arrivals_per_s > 0:
        raise ValueError("the calibration completed no request")
    typical = statistics.median(e2e_samples) if e2e_samples else 1.0
    return SoakCapacity("calibrated", arrivals_per_s, load, typical, {**detail, "e2e_samples": len(e2e_samples)})
