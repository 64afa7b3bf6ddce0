"""What the harness asks before a run: a gateway's boards, and the model's vocabulary size.

- `gateway_boards(http)`: the daemon targets of a gateway, from `GET /ready` (`"boards": {target:
  state}`; the body comes with 200 and 503 alike). The device figures are read from them unless
  `--daemon` names the daemons.
- `model_vocab(targets, vocab_of)`: the model's vocabulary size from the first daemon that answers
  `GetModel` (synthetic prompts draw their token ids below it), unless `--vocab` gives it.
- `first_answer(targets, ask, what, hint)`: the same for any question (the multi-turn workload asks
  for the model's tokenizer).

Raises typed errors: `Unavailable` when the gateway cannot be asked or no daemon answers (the
message says how to do without: `--daemon`, `--vocab`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import httpx
import orjson

from calculet.common.errors import CalculetError, Unavailable

T = TypeVar("T")


async def gateway_boards(http: httpx.AsyncClient, where: str) -> list[str]:
    """The gateway's board targets, in its order (`where` names the gateway in errors).

    Raises:
        Unavailable: the gateway does not answer, or its /ready body has no `boards` object.
    """
    try:
        response = await http.get("/ready")
        body = orjson.loads(response.content)
    except (httpx.HTTPError, orjson.JSONDecodeError) as err:
        raise Unavailable(f"gateway {where}: GET /ready failed: {err}") from None
    boards = body.get("boards") if isinstance(body, dict) else None
    if not isinstance(boards, dict):
        raise Unavailable(f"gateway {where}: GET /ready has no boards (HTTP {response.status_code})")
    return [str(target) for target in boards]


async def model_vocab(targets: Sequence[str], vocab_of: Callable[[str], Awaitable[int]]) -> int:
    """The vocabulary size from the first target that answers.

    Raises:
        Unavailable: no target (say which failed and why), with the hint to give --vocab.
    """
    return await first_answer(targets, vocab_of, "the model's vocabulary size", "give --vocab N")


async def first_answer(targets: Sequence[str], ask: Callable[[str], Awaitable[T]], what: str, hint: str) -> T:
    """`ask(target)` of the first target that answers, in order.

    Raises:
        Unavailable: no target answered: `cannot learn <what> (<target>: <why>; ...); <hint>`.
    """
    problems = []
    for target in targets:
        try:
            return await ask(target)
        except CalculetError as err:
            problems.append(f"{target}: {err.kind.value}: {err}")
    detail = "; ".join(problems) if problems else "no daemon to ask"
    raise Unavailable(f"cannot learn {what} ({detail}); {hint}")
