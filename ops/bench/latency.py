"""Per-request latencies from a `RequestRecord` (docs/benchmarking.md, "Definitions").

With `start` the send time, `t_0 .. t_k` the chunk arrivals carrying `n_0 .. n_k` tokens, `end` the
time the stream was complete and `out` the output tokens:

- TTFT = t_0 - start
- E2E  = end - start
- TPOT = (E2E - TTFT) / (out - 1), only when out > 1 (None otherwise)
- ITL: for each later chunk j >= 1 with gap g_j = t_j - t_{j-1}, `n_j` values of g_j / n_j (the gap
  divided among the tokens that arrived together, as vLLM's per-token accounting does). The tokens
  of the first chunk beyond its first have no gap of their own and give none. When the chunks' token
  counts are unknown (gateway SSE text) and cannot be inferred (chunks != out), each gap is one value
  (`itl_by_chunk` True), as vLLM does for OpenAI streams.

Pure functions of the record; no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.records import RequestRecord


@dataclass(frozen=True)
class RequestLatency:
    """One request's latencies in seconds (see the module docstring)."""

    ttft: float
    e2e: float
    tpot: float | None
    itls: tuple[float, ...]
    itl_by_chunk: bool


def chunk_token_counts(record: RequestRecord) -> list[int] | None:
    """Each chunk's token count: as recorded, else 1 each when there are as many chunks as output
    tokens, else None (unknown)."""
    counts = [c.tokens for c in record.chunks]
    if all(n is not None for n in counts):
        return [n for n in counts if n is not None]
    if len(counts) == record.output_tokens:
        return [1] * len(counts)
    return None


def request_latency(record: RequestRecord) -> RequestLatency:
    """The latencies of a finished, successful record.

    Raises:
        InvalidArgument: the record is not `ok` (failed, running, or without a chunk).
    """
    if not record.ok or record.end is None:
        raise InvalidArgument(f"request {record.index} has no latencies: {record.error or 'not finished'}")
    ttft = record.chunks[0].time - record.start
    e2e = record.end - record.start
    tpot = (e2e - ttft) / (record.output_tokens - 1) if record.output_tokens > 1 else None
    counts = chunk_token_counts(record)
    itls: list[float] = []
    for j in range(1, len(record.chunks)):
        gap = record.chunks[j].time - record.chunks[j - 1].time
        n = 1 if counts is None else counts[j]
        if n > 0:
            itls.extend([gap / n] * n)
    return RequestLatency(ttft, e2e, tpot, tuple(itls), counts is None)
