"""What the client saw of one request: `RequestRecord`, filled by a backend as the stream arrives.

Times are `time.perf_counter()` seconds, taken by the backend at the moment it handed the request to
its transport (`start`), at each token chunk's arrival, and when the stream was complete or failed
(`end`). A chunk's token count is None when the transport does not say (the gateway's SSE text
chunks); the latency module then falls back as docs/benchmarking.md says. A record is `ok` when it
ended without error and received at least one token chunk. Nothing here computes a metric.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChunkArrival:
    """One token chunk: when it arrived and how many tokens it carried (None = unknown)."""

    time: float
    tokens: int | None


@dataclass
class RequestRecord:
    """One request's timeline.

    Attributes:
        index: the request's index in the run.
        max_tokens: output tokens asked for.
        start: when it was sent.
        prompt_tokens: prompt length in tokens (None when unknown, e.g. a failed text prompt).
        chunks: every token chunk, in arrival order.
        end: when the stream was complete (or the failure was seen); None while running.
        output_tokens: tokens generated (the server's usage count, or the chunks' sum).
        error: why the request failed, or None.
    """

    index: int
    max_tokens: int
    start: float
    prompt_tokens: int | None = None
    chunks: list[ChunkArrival] = field(default_factory=list)
    end: float | None = None
    output_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and bool(self.chunks)

    def arrived(self, time: float, tokens: int | None) -> None:
        self.chunks.append(ChunkArrival(time, tokens))

    def finish(self, time: float, output_tokens: int) -> None:
        """The stream is complete; a stream without any token chunk is a failure."""
        self.end = time
        self.output_tokens = output_tokens
        if not self.chunks:
            self.error = "the stream ended without a token"

    def fail(self, time: float, error: str) -> None:
        self.end = time
        self.error = error
