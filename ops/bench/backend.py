"""The interface between the harness and what it measures: `BenchBackend`.

A backend turns a `BenchRequest` into one streamed generation and a `RequestRecord`. Two exist:
`gateway_backend.GatewayBackend` (OpenAI `/v1/completions` with SSE over httpx) and
`daemon_backend.DaemonBackend` (`AsyncDaemonClient.generate` straight to the boards). Both send the
same request: the prompt, `max_tokens`, `seed` = the `--seed` plus the request's index,
`ignore_eos` when asked, and the sampling `--temperature` / `--top-k` / `--top-p` name
(`BenchSampling`; unset: the server's default).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.workload import BenchRequest


@dataclass(frozen=True)
class BenchSampling:
    """Sampling parameters every request sends; None leaves the server's default."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None

    def fields(self) -> dict[str, Any]:
        """The parameters that are set, by their API names."""
        return {
            k: v
            for k, v in (("temperature", self.temperature), ("top_k", self.top_k), ("top_p", self.top_p))
            if v is not None
        }


class BenchBackend(ABC):
    """Sends benchmark requests over one transport. Used from one asyncio loop."""

    @abstractmethod
    async def prepare(self, requests: Sequence[BenchRequest]) -> list[BenchRequest]:
        """The requests in the form this backend sends, converted before the clock starts (the
        daemon backend tokenizes text prompts with the model's own tokenizer).

        Args:
            requests: the workload.

        Returns:
            The same requests, in order, possibly with token prompts instead of text.

        Raises:
            CalculetError: the conversion needs the server and it refused or cannot be reached.
        """

    @abstractmethod
    async def send(self, request: BenchRequest) -> RequestRecord:
        """Send one request, read its whole stream, and record what arrived when.

        Args:
            request: the request.

        Returns:
            Its record; a refused or broken request is a failed record (its `error` says why),
            never an exception.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release the transport (idempotent)."""

    @abstractmethod
    def describe(self) -> dict[str, object]:
        """The target's settings for the JSON report (kind and address)."""
