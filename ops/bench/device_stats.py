"""The device's side of a run: each daemon's utilisation counters read before and after, diffed.

A daemon's Status carries cumulative device figures since it opened the device (docs/metrics.md,
"Device busy ratio"; docs/metrics.md): device-clock seconds, compute-busy seconds (total and
per engine bank), phase seconds (H2D, compute, D2H on the device clock; sampling on the host) and
generated tokens. Over the run, each figure is after - before, and the busy ratio is
d(busy_seconds) / d(device_seconds) (None when the device clock did not move). Over several boards
the fleet ratio is the sum of their busy seconds over the sum of their device seconds. A daemon
that cannot be read, or that reports no utilisation (one older than the field), gives a board entry
with `error` set and no figures: the report says n/a rather than a made-up number.

Data flow: `sample_boards(targets, status_of)` -> {target: BoardSample} before and after ->
`board_utilization(before, after)` per target -> `fleet_busy_ratio`. `status_of(target)` is
injected (the command reads Status with `AsyncDaemonClient`; the protobuf is converted in
`wire_views`), so this module is plain data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from calculet.common.errors import CalculetError


@dataclass(frozen=True)
class ModelVersion:
    """One model a board serves, as its Status names it (docs/sources.md 001 §11: what ran)."""

    alias: str
    generation: int
    package_name: str
    package_hash: str
    calbin_sha256: str
    compiler: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class BoardVersions:
    """The versions a board reports: Runtime, driver, firmware, and its models' packages."""

    runtime: str
    driver: str
    firmware: str
    models: tuple[ModelVersion, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "runtime": self.runtime,
            "driver": self.driver,
            "firmware": self.firmware,
            "models": [
                {
                    "alias": m.alias,
                    "generation": m.generation,
                    "package": m.package_name,
                    "package_hash": m.package_hash,
                    "calbin_sha256": m.calbin_sha256,
                    "compiler": dict(m.compiler),
                }
                for m in self.models
            ],
        }


@dataclass(frozen=True)
class UtilizationSample:
    """Cumulative device figures at one moment (seconds; banks as (bank, busy seconds)), and the
    versions the board reported with them."""

    device_s: float
    busy_s: float
    banks: tuple[tuple[int, float], ...]
    h2d_s: float
    compute_s: float
    d2h_s: float
    sampling_s: float
    generated_tokens: int
    versions: BoardVersions | None = None
    d2h_bytes: int = 0  # copied back for sampled jobs (outputs' active rows + full rows read)
    sampled_rows: int = 0
    full_row_reads: int = 0  # top-k rows read in full
    d2d_s: float = 0.0  # compute seconds on the chip link (Status DeviceUtilization.d2d_seconds)
    d2d_bytes: int = 0  # bytes moved between chips
    slots: SlotSample | None = None  # None: a daemon older than ModelStatus.slots


@dataclass(frozen=True)
class SlotSample:
    """Decode rows and fixed-slot compactions of a board's models, summed (ModelStatus.slots;
    docs/daemon.md, "Fixed slots"); `fixed`: some model runs on fixed slots."""

    active_rows: int
    compiled_rows: int
    compactions: int
    fixed: bool


@dataclass(frozen=True)
class SlotFigures:
    """A board's decode rows over the run: the batch fill (active / compiled rows; None without a
    decode job) and the compactions per 1,000 generated tokens (None without a token)."""

    fill: float | None
    compactions: int
    compactions_per_1k_tokens: float | None
    fixed: bool


@dataclass(frozen=True)
class BoardSample:
    """A board's sample, or why there is none."""

    target: str
    sample: UtilizationSample | None
    error: str | None = None


@dataclass(frozen=True)
class BoardUtilization:
    """One board over the run: the differences of its figures; `error` set (and figures None) when
    either sample is missing."""

    target: str
    error: str | None
    device_s: float | None = None
    busy_s: float | None = None
    busy_ratio: float | None = None
    banks: tuple[tuple[int, float, float | None], ...] = ()  # (bank, busy seconds, ratio)
    h2d_s: float | None = None
    compute_s: float | None = None
    d2h_s: float | None = None
    sampling_s: float | None = None
    generated_tokens: int | None = None
    versions: BoardVersions | None = None  # as reported at the end of the run
    d2h_bytes: int | None = None
    sampled_rows: int | None = None
    full_row_reads: int | None = None
    d2d_s: float | None = None
    d2d_bytes: int | None = None
    slots: SlotFigures | None = None


StatusOf = Callable[[str], Awaitable[UtilizationSample | None]]


async def sample_boards(targets: Sequence[str], status_of: StatusOf) -> dict[str, BoardSample]:
    """Every target's sample, read concurrently; a typed failure is kept as the board's error."""

    async def one(target: str) -> BoardSample:
        try:
            sample = await status_of(target)
        except CalculetError as err:
            return BoardSample(target, None, f"{err.kind.value}: {err}")
        if sample is None:
            return BoardSample(target, None, "the daemon reports no device utilization (Status field 14)")
        return BoardSample(target, sample)

    samples = await asyncio.gather(*(one(t) for t in targets))
    return {s.target: s for s in samples}


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def board_utilization(before: BoardSample, after: BoardSample) -> BoardUtilization:
    """The board's figures over the run (after - before)."""
    if before.sample is None or after.sample is None:
        return BoardUtilization(before.target, before.error or after.error or "no sample")
    a, b = after.sample, before.sample
    device = a.device_s - b.device_s
    busy = a.busy_s - b.busy_s
    earlier = dict(b.banks)
    banks = tuple((bank, s - earlier.get(bank, 0.0), _ratio(s - earlier.get(bank, 0.0), device)) for bank, s in a.banks)
    return BoardUtilization(
        target=before.target,
        error=None,
        device_s=device,
        busy_s=busy,
        busy_ratio=_ratio(busy, device),
        banks=banks,
        h2d_s=a.h2d_s - b.h2d_s,
        compute_s=a.compute_s - b.compute_s,
        d2h_s=a.d2h_s - b.d2h_s,
        sampling_s=a.sampling_s - b.sampling_s,
        generated_tokens=a.generated_tokens - b.generated_tokens,
        versions=a.versions,
        d2h_bytes=a.d2h_bytes - b.d2h_bytes,
        sampled_rows=a.sampled_rows - b.sampled_rows,
        full_row_reads=a.full_row_reads - b.full_row_reads,
        d2d_s=a.d2d_s - b.d2d_s,
        d2d_bytes=a.d2d_bytes - b.d2d_bytes,
        slots=_slot_figures(b.slots, a.slots, a.generated_tokens - b.generated_tokens),
    )


def _slot_figures(before: SlotSample | None, after: SlotSample | None, tokens: int) -> SlotFigures | None:
    """The decode rows over the run; None when either sample lacks them. A model reloaded during
    the run restarts its counters, which this cannot tell: the figures are then what they are."""
    if before is None or after is None:
        return None
    compiled = after.compiled_rows - before.compiled_rows
    compactions = after.compactions - before.compactions
    return SlotFigures(
        fill=_ratio(after.active_rows - before.active_rows, compiled),
        compactions=compactions,
        compactions_per_1k_tokens=1000.0 * compactions / tokens if tokens > 0 else None,
        fixed=after.fixed,
    )


def fleet_busy_ratio(boards: Sequence[BoardUtilization]) -> float | None:
    """Sum of busy seconds over sum of device seconds of the boards that could be read."""
    read = [b for b in boards if b.error is None and b.device_s is not None and b.busy_s is not None]
    return _ratio(sum(b.busy_s or 0.0 for b in read), sum(b.device_s or 0.0 for b in read))
