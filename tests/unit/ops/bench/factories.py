"""Small factories for the bench tests: hand-made records and samples."""

from __future__ import annotations

from collections.abc import Sequence

from calculet.ops.bench.device_stats import UtilizationSample
from calculet.ops.bench.records import RequestRecord


def record(
    start: float,
    chunks: Sequence[tuple[float, int | None]],
    end: float,
    *,
    output_tokens: int | None = None,
    index: int = 0,
    max_tokens: int | None = None,
    prompt_tokens: int = 4,
) -> RequestRecord:
    """A finished record: chunks as (arrival time, token count or None); output tokens default to
    the chunks' sum."""
    out = output_tokens if output_tokens is not None else sum(n or 0 for _, n in chunks)
    rec = RequestRecord(index, max_tokens if max_tokens is not None else out, start, prompt_tokens=prompt_tokens)
    for time, n in chunks:
        rec.arrived(time, n)
    rec.finish(end, out)
    return rec


def failed(index: int, start: float, end: float, error: str = "unavailable: board down") -> RequestRecord:
    rec = RequestRecord(index, 8, start)
    rec.fail(end, error)
    return rec


def sample(device: float, busy: float, banks: Sequence[tuple[int, float]] = (), tokens: int = 0) -> UtilizationSample:
    return UtilizationSample(
        device_s=device,
        busy_s=busy,
        banks=tuple(banks),
        h2d_s=device / 10,
        compute_s=busy,
        d2h_s=device / 20,
        sampling_s=busy / 4,
        generated_tokens=tokens,
    )
