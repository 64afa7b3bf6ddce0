"""The requests a benchmark sends: synthetic prompts of random tokens with lengths fixed or drawn from a
range, or the prompts of a JSONL file.

Owns `BenchRequest` (one request: its prompt as tokens or text and its `max_tokens`), `LengthSpec`
(`N` or `LO:HI`, inclusive, drawn uniformly), `synthetic_requests` and `load_jsonl`. A JSONL line is an
object with `"prompt": str` or `"prompt_tokens": [int, ...]` (exactly one) and optionally
`"max_tokens": int` (else drawn from the output-length spec); other keys are ignored, blank lines
skipped. Every bad line is refused with `InvalidArgument` naming the file and line. Data flow: command
flags -> these functions (seeded `random.Random`) -> the runner, which sends them in order (the first
`--warmup` ones as warm-up).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calculet.common.errors import InvalidArgument


@dataclass(frozen=True)
class BenchRequest:
    """One request of the workload.

    Attributes:
        index: its position in the run (warm-up requests first); the sampling seed derives from it.
        max_tokens: output tokens asked for (exactly this many with `--ignore-eos`).
        prompt_tokens: the prompt as token ids, or None when it is text.
        prompt_text: the prompt as text (JSONL `prompt`), or None.
    """

    index: int
    max_tokens: int
    prompt_tokens: tuple[int, ...] | None = None
    prompt_text: str | None = None

    def with_index(self, index: int) -> BenchRequest:
        return BenchRequest(index, self.max_tokens, self.prompt_tokens, self.prompt_text)

    def with_tokens(self, tokens: tuple[int, ...]) -> BenchRequest:
        return BenchRequest(self.index, self.max_tokens, tokens, None)


@dataclass(frozen=True)
class LengthSpec:
    """A length: fixed (`low == high`) or uniform over `low..high` inclusive."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str, flag: str) -> LengthSpec:
        """`N` or `LO:HI` with 1 <= LO <= HI.

        Raises:
            InvalidArgument: anything else; the message names `flag`.
        """
        low_text, sep, high_text = text.partition(":")
        try:
            low = int(low_text)
            high = int(high_text) if sep else low
        except ValueError:
            raise InvalidArgument(f"{flag} {text!r}: expected N or LO:HI (whole numbers)") from None
        if not 1 <= low <= high:
            raise InvalidArgument(f"{flag} {text!r}: expected 1 <= LO <= HI")
        return cls(low, high)

    def draw(self, rng: random.Random) -> int:
        return self.low if self.low == self.high else rng.randint(self.low, self.high)

    def as_list(self) -> list[int]:
        return [self.low, self.high]


def synthetic_requests(
    count: int, prompt_len: LengthSpec, output_len: LengthSpec, vocab: int, rng: random.Random
) -> list[BenchRequest]:
    """`count` requests of uniformly random token ids in `0..vocab-1`, lengths drawn from the specs.

    Raises:
        InvalidArgument: `vocab` < 1.
    """
    if vocab < 1:
        raise InvalidArgument(f"vocab: must be at least 1, got {vocab}")
    out = []
    for index in range(count):
        n = prompt_len.draw(rng)
        tokens = tuple(rng.randrange(vocab) for _ in range(n))
        out.append(BenchRequest(index, output_len.draw(rng), prompt_tokens=tokens))
    return out


def load_jsonl(path: Path, output_len: LengthSpec, rng: random.Random) -> list[BenchRequest]:
    """The prompts of a JSONL file, in file order (see the module docstring for a line's shape).

    Raises:
        InvalidArgument: the file cannot be read, holds no prompt, or a line is not a valid object;
            the message says `PATH:LINE: what is wrong`.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InvalidArgument(f"{path}: cannot be read: {reason}") from None
    out: list[BenchRequest] = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            out.append(_jsonl_request(len(out), line, output_len, rng, f"{path}:{number}"))
    if not out:
        raise InvalidArgument(f"{path}: holds no prompt (one JSON object a line)")
    return out


def _jsonl_request(index: int, line: str, output_len: LengthSpec, rng: random.Random, where: str) -> BenchRequest:
    try:
        obj: Any = json.loads(line)
    except json.JSONDecodeError as err:
        raise InvalidArgument(f"{where}: not JSON: {err.msg} (column {err.colno})") from None
    if not isinstance(obj, dict):
        raise InvalidArgument(f"{where}: expected a JSON object, got {type(obj).__name__}")
    has_text, has_tokens = "prompt" in obj, "prompt_tokens" in obj
    if has_text == has_tokens:
        raise InvalidArgument(f'{where}: give exactly one of "prompt" (text) and "prompt_tokens" (token ids)')
    max_tokens = _max_tokens(obj.get("max_tokens"), where) if "max_tokens" in obj else output_len.draw(rng)
    if has_text:
        text = obj["prompt"]
        if not isinstance(text, str) or not text:
            raise InvalidArgument(f'{where}: "prompt" must be a non-empty string')
        return BenchRequest(index, max_tokens, prompt_text=text)
    return BenchRequest(index, max_tokens, prompt_tokens=_tokens(obj["prompt_tokens"], where))


def _max_tokens(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f'{where}: "max_tokens" must be a whole number >= 1, got {value!r}')
    return value


def _tokens(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidArgument(f'{where}: "prompt_tokens" must be a non-empty list of token ids')
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise InvalidArgument(f'{where}: "prompt_tokens" holds {token!r}; token ids are whole numbers >= 0')
    return tuple(value)


def cycle_to(requests: list[BenchRequest], count: int) -> list[BenchRequest]:
    """`count` requests taken from `requests` in order, starting again at the first when they run
    out; re-indexed 0..count-1."""
    return [requests[i % len(requests)].with_index(i) for i in range(count)]
