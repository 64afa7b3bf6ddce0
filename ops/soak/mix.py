"""The soak's request pool: a finite, seeded set of OpenAI chat requests, re-sent all run long.

Owns `RequestSpec` (one pool entry: its kind, the user message(s), `max_tokens`, `n`, `seed`,
`temperature`, streamed or not, and what the client does: read to the end, close the stream after
k chunks, or give up after a timeout), `MixShape` (token sizes, by the package's lane context) and
`build_pool`. Every spec has a fixed `seed`, so its answer is one text per choice whatever board,
batch or retry serves it, and the reference fleet computes it once (`references`).

Kinds, in fixed shares of the pool (`KIND_SHARES`): `short` and `long` prompts (streamed or not),
`n` (2 or 3 choices), `disconnect` (a stream closed after 1..4 chunks), `timeout` (not streamed,
a client timeout of a fraction of the typical end-to-end time, `TrafficRunner` sets it) and
`conversation` (`CONVERSATION_TURNS` user messages, turn k+1 carrying turn k's answer, as
`ops/bench/multiturn` builds them); and where a lane holds it (`LONG_CONTEXT_MIN_LANE`, e.g. the
batch-1 calbin's 40,960 tokens), `long_context`: one prompt of 30,000 tokens or more at a small
share (`LONG_CONTEXT_SHARE`), its reference computed like the others'. Texts are words of
`ops/bench/multiturn/text.WORDS` sized with the model's own tokenizer. Same seed, size and tokenizer: the same pool.

Data flow: `build_pool(size, seed, shape, count)` -> `references.ReferenceBook` and
`traffic.TrafficRunner`; `request_shapes` gives the timing model's view (`capacity`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum
from typing import Any

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.limit import RequestShape
from calculet.ops.bench.multiturn.text import TokenCounter, sized_text

TEMPERATURES = (0.0, 0.8, 1.0)
CONVERSATION_TURNS = 3
TEMPLATE_TOKENS_PER_MESSAGE = 5  # ChatML's role markers around each message (an estimate, for the limit)
# Shares of the pool by kind (percent); every kind gets at least one spec.
KIND_SHARES: tuple[tuple[str, int], ...] = (
    ("short", 36),
    ("long", 10),
    ("n", 12),
    ("disconnect", 12),
    ("timeout", 8),
    ("conversation", 22),
)
SMALL_CONTEXT = 1024  # a lane context up to this gets the small mix (the tiny preset: 256)
SWITCH_BURST = 4  # requests a `model_switch` fault sends to the model it switched a board to
LONG_CONTEXT_KIND = "long_context"
LONG_CONTEXT_PROMPT = (30_000, 32_000)
LONG_CONTEXT_OUTPUT = (16, 64)
# The longest prompt, its output and the chat template's few tokens, with room to spare.
LONG_CONTEXT_MIN_LANE = 33_000
# Percent, beside KIND_SHARES' 100: on a batch-1 board one such request holds the board for minutes
# of board time (a 30,000-token prefill), so 1 % of the arrivals is already a large share of its time.
LONG_CONTEXT_SHARE = 1


class ClientMove(Enum):
    """What the client does with a request."""

    COMPLETE = "complete"  # reads the whole answer
    DISCONNECT = "disconnect"  # closes the stream after `disconnect_after` chunks
    TIMEOUT = "timeout"  # gives up after its client timeout (not streamed)


@dataclass(frozen=True)
class MixShape:
    """Token sizes of the pool, each an inclusive (low, high) range.

    Attributes:
        short_prompt / long_prompt: user message tokens of single requests.
        output: `max_tokens` of single requests.
        turn_prompt / turn_output: user message and `max_tokens` of each conversation turn.
        long_context: the `long_context` kind's prompt tokens (None: the lanes cannot hold it).
    """

    short_prompt: tuple[int, int]
    long_prompt: tuple[int, int]
    output: tuple[int, int]
    turn_prompt: tuple[int, int]
    turn_output: tuple[int, int]
    long_context: tuple[int, int] | None = None

    def describe(self) -> dict[str, list[int] | None]:
        return {k: None if v is None else list(v) for k, v in self.__dict__.items()}

    @property
    def shares(self) -> tuple[tuple[str, int], ...]:
        """The kinds and their shares: `KIND_SHARES`, and `long_context` where it fits."""
        return KIND_SHARES if self.long_context is None else (*KIND_SHARES, (LONG_CONTEXT_KIND, LONG_CONTEXT_SHARE))


def mix_shape(lane_context: int) -> MixShape:
    """The sizes for a package whose lanes hold `lane_context` tokens: a small mix that fits the
    tiny preset's 256 (longest conversation about 200 tokens), else the qwen-sized one, with the
    `long_context` kind when a lane holds `LONG_CONTEXT_MIN_LANE` tokens."""
    if lane_context <= SMALL_CONTEXT:
        return MixShape((4, 24), (64, 112), (4, 40), (6, 16), (8, 24))
    long_context = LONG_CONTEXT_PROMPT if lane_context >= LONG_CONTEXT_MIN_LANE else None
    return MixShape((16, 64), (512, 1024), (16, 128), (24, 96), (32, 96), long_context)


@dataclass(frozen=True)
class RequestSpec:
    """One request of the pool (module docstring).

    Attributes:
        key: its name in the report, `r<index>`.
        kind: one of `KIND_SHARES`.
        messages: the user message of each turn (one unless a conversation).
        message_tokens: each message's tokens as the model's tokenizer counts the text alone.
        max_tokens: of every turn.
        n: choices.
        seed: the request's sampling seed (choice i samples with seed + i).
        temperature: 0, 0.8 or 1.0.
        stream: streamed (with the usage chunk).
        move: what the client does.
        disconnect_after: chunks read before the stream is closed (DISCONNECT).
        timeout_fraction: the client timeout over the typical end-to-end time (TIMEOUT).
    """

    key: str
    kind: str
    messages: tuple[str, ...]
    message_tokens: tuple[int, ...]
    max_tokens: int
    n: int
    seed: int
    temperature: float
    stream: bool
    move: ClientMove = ClientMove.COMPLETE
    disconnect_after: int = 0
    timeout_fraction: float = 0.0

    @property
    def turns(self) -> int:
        return len(self.messages)

    def chat_messages(self, turn: int, answers: tuple[str, ...]) -> list[dict[str, str]]:
        """OpenAI `messages` of turn `turn` (0-based): every earlier user message followed by its
        answer (`answers[k]`, the text the previous turn returned), then this turn's message.

        Raises:
            InvalidArgument: `turn` out of range, or fewer answers than earlier turns.
        """
        if not 0 <= turn < self.turns or len(answers) < turn:
            raise InvalidArgument(f"{self.key}: turn {turn} needs {turn} earlier answers, got {len(answers)}")
        out: list[dict[str, str]] = []
        for k in range(turn):
            out += [{"role": "user", "content": self.messages[k]}, {"role": "assistant", "content": answers[k]}]
        out.append({"role": "user", "content": self.messages[turn]})
        return out

    def body(self, model: str, turn: int, answers: tuple[str, ...]) -> dict[str, Any]:
        """The OpenAI request of turn `turn`, as sent to the soak fleet and to the reference fleet."""
        body: dict[str, Any] = {
            "model": model,
            "messages": self.chat_messages(turn, answers),
            "max_tokens": self.max_tokens,
            "n": self.n,
            "seed": self.seed,
            "temperature": self.temperature,
            "stream": self.stream,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return body


def build_pool(size: int, seed: int, shape: MixShape, count: TokenCounter) -> list[RequestSpec]:
    """`size` specs in `shape.shares` proportions, in a seeded order (module docstring).

    Raises:
        InvalidArgument: `size` smaller than the number of kinds.
    """
    shares = shape.shares
    if size < len(shares):
        raise InvalidArgument(f"pool: needs at least {len(shares)} requests (one per kind), got {size}")
    rng = random.Random(f"calctl-soak:{seed}:pool")
    kinds = _kinds(size, rng, shares)
    return [_spec(i, kind, seed, shape, count, rng) for i, kind in enumerate(kinds)]


def _kinds(size: int, rng: random.Random, shares: tuple[tuple[str, int], ...] = KIND_SHARES) -> list[str]:
    """Each kind's share of `size` (largest remainders), every kind at least once, shuffled."""
    total = sum(share for _, share in shares)
    exact = {kind: size * share / total for kind, share in shares}
    counts = {kind: int(value) for kind, value in exact.items()}
    for kind in sorted(exact, key=lambda k: exact[k] - counts[k], reverse=True)[: size - sum(counts.values())]:
        counts[kind] += 1
    for kind in [k for k, n in counts.items() if n == 0]:
        counts[max(counts, key=lambda k: counts[k])] -= 1
        counts[kind] = 1
    kinds = [kind for kind, _ in shares for _ in range(counts[kind])]
    rng.shuffle(kinds)
    return kinds


def _spec(index: int, kind: str, seed: int, shape: MixShape, count: TokenCounter, rng: random.Random) -> RequestSpec:
    words = random.Random(f"calctl-soak:{seed}:text:{index}")
    turns = CONVERSATION_TURNS if kind == "conversation" else 1
    prompt = {"long": shape.long_prompt, "conversation": shape.turn_prompt}.get(kind, shape.short_prompt)
    output = shape.turn_output if kind == "conversation" else shape.output
    if kind == LONG_CONTEXT_KIND and shape.long_context is not None:
        prompt, output = shape.long_context, LONG_CONTEXT_OUTPUT
    texts = [sized_text(rng.randint(*prompt), count, words) for _ in range(turns)]
    stream = {"disconnect": True, "timeout": False}.get(kind, rng.random() < 0.5)
    move = {"disconnect": ClientMove.DISCONNECT, "timeout": ClientMove.TIMEOUT}.get(kind, ClientMove.COMPLETE)
    return RequestSpec(
        key=f"r{index:04d}",
        kind=kind,
        messages=tuple(t.text for t in texts),
        message_tokens=tuple(t.tokens for t in texts),
        max_tokens=rng.randint(*output),
        n=rng.choice((2, 3)) if kind == "n" else 1,
        seed=seed * 100_000 + index,
        temperature=rng.choice(TEMPERATURES),
        stream=stream,
        move=move,
        disconnect_after=rng.randint(1, 4) if move is ClientMove.DISCONNECT else 0,
        timeout_fraction=round(rng.uniform(0.3, 1.5), 3) if move is ClientMove.TIMEOUT else 0.0,
    )


def burst_specs(pool: list[RequestSpec], count: int = SWITCH_BURST) -> list[RequestSpec]:
    """The `model_switch` fault's burst: the pool's first `count` `short` specs, sent to the other
    model (their references are that model's)."""
    return [spec for spec in pool if spec.kind == "short"][:count]


def request_shapes(spec: RequestSpec) -> list[RequestShape]:
    """The device's view of one send of `spec`, for the timing-model limit: one shape per turn and
    choice; a prompt is its messages' tokens, `TEMPLATE_TOKENS_PER_MESSAGE` each, and every earlier
    answer taken at `max_tokens` (an upper bound); the output is `max_tokens` (a cut request is
    counted whole: the load is then a little below the one asked for, never above)."""
    shapes = []
    history = 0
    for turn in range(spec.turns):
        prompt = history + spec.message_tokens[turn] + TEMPLATE_TOKENS_PER_MESSAGE * (2 * turn + 1)
        shapes += [RequestShape(max(1, prompt), spec.max_tokens)] * spec.n
        history += spec.message_tokens[turn] + spec.max_tokens
    return shapes
