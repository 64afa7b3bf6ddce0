"""Small builders for the soak's pure parts: exchanges, points and specs, no processes."""

from __future__ import annotations

from calculet.ops.soak.classify import RequestClass
from calculet.ops.soak.exchange import Exchange, ExchangeError
from calculet.ops.soak.mix import ClientMove, RequestSpec
from calculet.ops.soak.points import RequestPoint


def exchange(
    texts: list[str],
    finishes: list[str | None] | None = None,
    *,
    stream: bool = True,
    cut: str | None = None,
    error: ExchangeError | None = None,
    start: float = 10.0,
    first_token: float | None = 10.1,
    end: float = 11.0,
    tokens: int | None = 11,
) -> Exchange:
    got = Exchange(start, stream, len(texts))
    got.texts = list(texts)
    got.finishes = list(finishes) if finishes is not None else ["stop"] * len(texts)
    got.cut, got.error = cut, error
    got.first_token, got.end, got.completion_tokens = first_token, end, tokens
    return got


def http_error(status: int, message: str = "no", code: str | None = None) -> ExchangeError:
    return ExchangeError("http", status, code, message)


def point(
    end_s: float,
    cls: RequestClass = RequestClass.OK,
    ttft_s: float | None = 0.1,
    tpot_s: float | None = 0.01,
    tokens: int = 10,
) -> RequestPoint:
    return RequestPoint(end_s - 1.0, end_s, cls, "short", ttft_s, tpot_s, tokens)


def spec(
    messages: tuple[str, ...] = ("hello there",),
    tokens: tuple[int, ...] = (3,),
    *,
    n: int = 1,
    stream: bool = False,
    max_tokens: int = 8,
    move: ClientMove = ClientMove.COMPLETE,
) -> RequestSpec:
    kind = "conversation" if len(messages) > 1 else "short"
    return RequestSpec("r0001", kind, messages, tokens, max_tokens, n, 7, 0.8, stream, move)
