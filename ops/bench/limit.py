"""The timing-model limit: the best a perfect host could do on calsim's modelled board.

Pure functions of a `DeviceModel` (the package's timing table, decode batches, lanes, copy sizes),
the requests' shapes (prompt and output tokens) and the serving policy; the durations are calsim's
own (`calculet.daemon.calsim.timing`: `prefill_ms`, `decode_ms`, `copy_s`), so the limit and the
emulator cannot drift apart. Seconds are MODELLED seconds (the device clock); at `--time-scale s`
they take `s` times as long on the wall.

A request of `n` prompt and `m` output tokens is one prefill job (its first token comes from the
prefill's logits) and `m - 1` decode steps; step `k` attends over `n + k` KV entries. With `r` rows
per decode step on compiled batch `B` (`DeviceModel.batch_for(r)`):

- prefill: `P(n) = prefill_ms(n, past=0)`, copies `h_p = n * prefill_h2d_per_token / h2d_bw` and
  `d_p = prefill_d2h_per_row / d2h_bw`;
- decode step `k`: compute `D_B(n + k) = decode_ms(B, n + k)`, copies `h_d = r * decode_h2d_per_row /
  h2d_bw` and `d_d = r * decode_d2h_per_row / d2h_bw`; the step is shared by its `r` rows, so a
  request's share is `1 / r` of it. A perfect host runs rows of equal length together (a row's step
  costs the curve at its OWN length; a batch is padded to its longest row, so mixing lengths only
  costs more).

Device time of a set of requests (`WorkloadLimit`):

- in-flight 1 (`--policy serial`, or `--max-inflight 1`): nothing overlaps, every phase is serial:
  `T1 = sum_i [h_p + P + d_p + sum_k (h_d + D_B + d_d) / r]`;
- in-flight 2 (ping/pong banks): calsim's clock (daemon/calsim/clock.py) has one H2D path, one
  compute unit and a D2H path of its own, so one job's copies overlap the other bank's compute; the
  compute unit is the floor, `C = sum_i [P + sum_k D_B / r]`. But one decode job per model is in
  flight at a time and its next step waits for its D2H (the sampled token is the next input), so
  the decode steps form a chain whose copies only prefills on the other bank can hide:
  `chain = sum_i sum_k (h_d + D_B + d_d) / r`. `T2 = max(C, chain)`; the overlap the banks allow is
  `T1 - T2`.

The limit's throughput is `sum_i m_i / T` output tokens per modelled second for one board; `b`
boards sharing the requests evenly give `b` times that. The floors of ONE request alone (what a
perfect host gives it at the run's batch) are `ttft = h_p + P + d_p`, the mean decode step
`(sum_k (h_d + D_B + d_d)) / (m - 1)` and `e2e = ttft + sum_k (h_d + D_B + d_d)`.

A package declaring cross-chip traffic (`topology.d2d`) adds calsim's link time to the compute:
`P(n) += d2d_s(n * bytes_per_token)` and `D_B += d2d_s(B * bytes_per_token)` (daemon/calsim/timing.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from calculet.common.errors import InvalidArgument
from calculet.daemon.calsim.timing import attention_ms, copy_s, d2d_s, decode_batch1_ms, decode_ms, prefill_ms
from calculet.daemon.package.manifest import TimingDecl
from calculet.ops.bench.device_model import DeviceModel


class Policy(Enum):
    """The daemon's scheduling policy (`--policy`)."""

    SERIAL = "serial"
    CONTINUOUS = "continuous"


@dataclass(frozen=True)
class Serving:
    """How the daemon runs jobs: its policy and device jobs in flight (serial is always 1)."""

    policy: Policy
    max_inflight: int

    def __post_init__(self) -> None:
        if self.max_inflight not in (1, 2):
            raise InvalidArgument(f"max_inflight: must be 1 or 2, got {self.max_inflight}")

    @property
    def inflight(self) -> int:
        return 1 if self.policy is Policy.SERIAL else self.max_inflight

    def rows(self, model: DeviceModel, concurrency: int) -> int:
        """Decode rows per step a board can fill with `concurrency` requests: 1 for serial, else
        bounded by the largest compiled batch and the lanes."""
        if concurrency < 1:
            raise InvalidArgument(f"concurrency: must be at least 1, got {concurrency}")
        if self.policy is Policy.SERIAL:
            return 1
        return min(concurrency, model.max_batch, model.lanes)


@dataclass(frozen=True)
class RequestShape:
    """A request as the device sees it: prompt tokens prefilled, output tokens generated."""

    prompt: int
    output: int

    def __post_init__(self) -> None:
        if self.prompt < 1 or self.output < 1:
            raise InvalidArgument(f"request shape: prompt and output must be >= 1, got {self.prompt}/{self.output}")


@dataclass(frozen=True)
class RequestFloor:
    """One request's modelled seconds at `rows` rows per decode step (module docstring).

    Attributes:
        prefill_copies: `h_p + d_p`.
        prefill_compute: `P(n)`.
        decode_steps: `m - 1`.
        decode_compute: `sum_k D_B(n + k)`, whole steps (not divided by rows).
        decode_copies: `(m - 1) * (h_d + d_d)`, whole steps.
    """

    prefill_copies: float
    prefill_compute: float
    decode_steps: int
    decode_compute: float
    decode_copies: float

    @property
    def ttft(self) -> float:
        return self.prefill_copies + self.prefill_compute

    @property
    def step(self) -> float | None:
        """The mean decode step, copies included; None for a one-token request."""
        return (self.decode_compute + self.decode_copies) / self.decode_steps if self.decode_steps else None

    @property
    def e2e(self) -> float:
        return self.ttft + self.decode_compute + self.decode_copies


def request_floor(model: DeviceModel, shape: RequestShape, rows: int) -> RequestFloor:
    """The modelled phases of `shape` at `rows` decode rows per step (compiled batch `batch_for(rows)`)."""
    t, n, steps = model.timing, shape.prompt, shape.output - 1
    batch = model.batch_for(rows)
    h_p = copy_s(n * model.prefill_h2d_per_token, t.h2d_gbps)
    d_p = copy_s(model.prefill_d2h_per_row, t.d2h_gbps)
    step_copies = copy_s(rows * model.decode_h2d_per_row, t.h2d_gbps) + copy_s(
        rows * model.decode_d2h_per_row, t.d2h_gbps
    )
    decode = decode_sum_ms(t, batch, n, steps) / 1000.0
    prefill = prefill_ms(t, n, 0) / 1000.0
    if model.d2d is not None:  # the chips wait on the link inside the compute, as calsim charges it
        prefill += d2d_s(model.d2d, n * model.d2d.bytes_per_token)
        decode += steps * d2d_s(model.d2d, batch * model.d2d.bytes_per_token)
    return RequestFloor(h_p + d_p, prefill, steps, decode, steps * step_copies)


def decode_sum_ms(t: TimingDecl, batch: int, prompt: int, steps: int) -> float:
    """`sum(decode_ms(t, batch, prompt + k), k = 1..steps)` in O(curve points), from calsim's own
    functions: a batch-B step is the batch-1 curve times a factor that does not depend on the KV
    length, and `attention_ms(steps, prompt)` is `sum(t1(prompt + k) - t1(0), k = 1..steps)`."""
    if steps == 0:
        return 0.0
    factor = decode_ms(t, batch, 0) / decode_batch1_ms(t, 0)
    return factor * (attention_ms(t, steps, prompt) + steps * decode_batch1_ms(t, 0))


@dataclass(frozen=True)
class WorkloadLimit:
    """The device time of a set of requests on one board, and the limit it sets.

    Attributes:
        rows / batch: decode rows per step and the compiled batch they run on.
        requests / output_tokens: how many requests, and their output tokens.
        inflight: device jobs in flight (1 or 2).
        serial_s: `T1`, every phase one after the other.
        compute_s: `C`, the compute unit's time.
        chain_s: the decode chain's time, its copies included.
        device_s: the limit's device time: `T1` with in-flight 1, `max(C, chain)` with 2.
    """

    rows: int
    batch: int
    requests: int
    output_tokens: int
    inflight: int
    serial_s: float
    compute_s: float
    chain_s: float
    device_s: float

    @property
    def overlap_s(self) -> float:
        """Device seconds the ping/pong banks hide (0 with in-flight 1)."""
        return self.serial_s - self.device_s

    @property
    def s_per_request(self) -> float:
        return self.device_s / self.requests

    @property
    def s_per_output_token(self) -> float:
        return self.device_s / self.output_tokens

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens per modelled second of one board."""
        return self.output_tokens / self.device_s


def workload_limit(model: DeviceModel, shapes: Sequence[RequestShape], serving: Serving, rows: int) -> WorkloadLimit:
    """The limit of `shapes` run on one board at `rows` decode rows per step.

    Raises:
        InvalidArgument: no request, or `rows` outside 1..lanes.
    """
    if not shapes:
        raise InvalidArgument("the limit needs at least one request")
    if not 1 <= rows <= model.lanes:
        raise InvalidArgument(f"rows: must be in 1..{model.lanes} (the lanes), got {rows}")
    floors = [request_floor(model, s, rows) for s in shapes]
    serial = sum(f.ttft + (f.decode_compute + f.decode_copies) / rows for f in floors)
    compute = sum(f.prefill_compute + f.decode_compute / rows for f in floors)
    chain = sum((f.decode_compute + f.decode_copies) / rows for f in floors)
    inflight = serving.inflight
    device = serial if inflight == 1 else max(compute, chain)
    output = sum(s.output for s in shapes)
    batch = model.batch_for(rows)
    return WorkloadLimit(rows, batch, len(shapes), output, inflight, serial, compute, chain, device)


def limits_by_batch(model: DeviceModel, shapes: Sequence[RequestShape], serving: Serving) -> list[WorkloadLimit]:
    """The saturation limit for each compiled decode batch: `rows = min(batch, lanes)` rows a step
    (serial: one row, on the smallest batch, whatever the package holds)."""
    if serving.policy is Policy.SERIAL:
        return [workload_limit(model, shapes, serving, 1)]
    return [workload_limit(model, shapes, serving, min(b, model.lanes)) for b in model.decode_batches]


def rows_at_load(model: DeviceModel, serving: Serving, in_flight: float, boards: int) -> int:
    """Rows a board fills when `in_flight` requests are spread evenly over `boards` boards."""
    if boards < 1:
        raise InvalidArgument(f"boards: must be at least 1, got {boards}")
    per_board = max(1, math.ceil(in_flight / boards - 1e-9))
    return serving.rows(model, per_board)
