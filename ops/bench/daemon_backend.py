"""`DaemonBackend`: benchmark requests sent straight to board daemons with `AsyncDaemonClient`.

Request i goes to daemon `i % len(clients)` (round robin) as `generate(model, prompt_tokens,
max_tokens, seed = --seed + i, ignore_eos)`. Times: `start` just before Submit (so TTFT includes the
Submit round trip, as a gateway's does), each token chunk when the client handed it over, with its
exact token count, `end` when the job's Final arrived. Text prompts (JSONL `prompt`) are tokenized
before the run with the model's own tokenizer (`GetModel`'s tokenizer.json, no special tokens
added). A typed client error (refusal, broken stream after the client's re-attach attempts) becomes
a failed record `"<kind>: <message>"`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tokenizers import Tokenizer

from calculet.client import AsyncDaemonClient
from calculet.common.errors import CalculetError, InvalidArgument
from calculet.ops.bench.backend import BenchBackend, BenchSampling
from calculet.ops.bench.records import RequestRecord
from calculet.ops.bench.workload import BenchRequest


class DaemonBackend(BenchBackend):
    """Streams generations from daemons (see the module docstring).

    Args:
        clients: one client per daemon, at least one (owned: `close` closes them).
        model: the model alias.
        ignore_eos: ask for exactly `max_tokens` tokens.
        seed: request i samples with seed `seed + i`.
    """

    def __init__(
        self,
        clients: Sequence[AsyncDaemonClient],
        model: str,
        *,
        ignore_eos: bool,
        seed: int,
        sampling: BenchSampling | None = None,
    ) -> None:
        if not clients:
            raise InvalidArgument("the daemon backend needs at least one daemon")
        self._clients, self._model = list(clients), model
        self._ignore_eos, self._seed = ignore_eos, seed
        self._sampling = (sampling or BenchSampling()).fields()

    async def prepare(self, requests: Sequence[BenchRequest]) -> list[BenchRequest]:
        if all(r.prompt_tokens is not None for r in requests):
            return list(requests)
        info = await self._clients[0].get_model(self._model)
        tokenizer = Tokenizer.from_str(info.tokenizer_json.decode("utf-8"))
        out = []
        for request in requests:
            if request.prompt_tokens is None:
                ids = tuple(tokenizer.encode(request.prompt_text or "", add_special_tokens=False).ids)
                if not ids:
                    raise InvalidArgument(f"request {request.index}: the prompt text makes no token")
                request = request.with_tokens(ids)
            out.append(request)
        return out

    async def send(self, request: BenchRequest) -> RequestRecord:
        if request.prompt_tokens is None:
            raise InvalidArgument(f"request {request.index}: not prepared (text prompt)")
        client = self._clients[request.index % len(self._clients)]
        tokens = request.prompt_tokens
        record = RequestRecord(request.index, request.max_tokens, time.perf_counter(), prompt_tokens=len(tokens))
        try:
            generation = await client.generate(
                self._model,
                tokens,
                max_tokens=request.max_tokens,
                seed=self._seed + request.index,
                ignore_eos=self._ignore_eos,
                **self._sampling,
            )
            async with generation:
                async for chunk in generation.chunks():
                    record.arrived(time.perf_counter(), len(chunk.tokens))
                record.finish(time.perf_counter(), len(generation.tokens))
        except CalculetError as err:
            record.fail(time.perf_counter(), f"{err.kind.value}: {err}")
        return record

    async def close(self) -> None:
        for client in self._clients:
            await client.close()

    def describe(self) -> dict[str, object]:
        return {"kind": "daemon", "daemons": [c.target.text for c in self._clients]}
