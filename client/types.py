"""The client's own message types: what callers of `calculet.client` pass and get back.

Frozen dataclasses and enums with plain Python fields (no numpy, no protobuf), so a program that
only talks to daemons (the gateway, scripts) imports none of the daemon's engine. Data flow:
callers build `SamplingParams` -> `calculet.client.convert` turns it into the Submit message;
Wait events, GetModel and WatchLoad answers come back through `convert` as `TokenChunk` /
`FinalEvent`, `ModelInfo` and `LoadReport`. The daemon keeps its own domain types
(`calculet.daemon.core`, `calculet.daemon.sampling`); both sides meet only on the wire
(`protos/calculet/v1/*.proto`, whose comments define every field's meaning and units).

Enums read from the wire: a number this client does not know (a newer daemon) maps to a safe value
rather than failing a whole stream: `FinishReason.ERROR`, `ModelState.UNKNOWN`,
`ServingStatus.NOT_SERVING`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from calculet.common.errors import CalculetError, InvalidArgument

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


@dataclass(frozen=True)
class Constraint:
    """What a completion must match (inference.proto `Constraint`; docs/daemon.md "Constrained decoding").

    Build one with a class method, exactly one form per constraint:
        Constraint.of_json_schema(schema)   # a JSON schema, as a dict or its JSON text
        Constraint.of_json_object()         # any JSON object
        Constraint.of_regex(pattern)        # Rust regex syntax; the whole output matches it
        Constraint.of_choice(["yes", "no"]) # exactly one of the strings
        Constraint.of_lark(grammar)         # llguidance's Lark dialect; the output matches `start`
    and pass it as `SamplingParams(constraint=...)`. The daemon compiles it with llguidance against
    the model package's tokenizer (once per package and constraint) and draws every token from the
    logits with the forbidden tokens removed; EOS is allowed only where the constraint is complete, and
    a token after which nothing may follow ends the job with `FinishReason.STOP`. JSON is compact
    unless the schema's "x-guidance" options say otherwise.

    Attributes (read only; the class methods set them):
        kind: "json_schema", "json_object", "regex", "choice" or "lark" (the proto's field name).
        text: the schema (JSON text), regex or grammar; "" for json_object and choice.
        choices: the strings of a choice, else ().

    Only the shape is checked here (one form, strings, a non-empty choice); the daemon refuses a schema,
    regex or grammar llguidance cannot compile, over 64 KiB of text (all choices together) or over 256
    choices, with `InvalidArgument` naming the field (e.g. "constraint.regex: ...").

    Raises:
        InvalidArgument: an unknown kind, a non-string, or text/choices not matching the kind.
    """

    kind: str
    text: str = ""
    choices: tuple[str, ...] = ()

    KINDS: ClassVar[tuple[str, ...]] = ("json_schema", "json_object", "regex", "choice", "lark")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise InvalidArgument(f"constraint: kind must be one of {', '.join(self.KINDS)}, got {self.kind!r}")
        if not isinstance(self.text, str) or not all(isinstance(c, str) for c in self.choices):
            raise InvalidArgument(f"constraint.{self.kind}: must be text")
        if self.kind == "choice":
            if not self.choices or self.text:
                raise InvalidArgument("constraint.choice: at least one string")
        elif self.choices or (self.kind != "json_object") != bool(self.text):
            raise InvalidArgument(f"constraint.{self.kind}: needs its text and nothing else")

    @classmethod
    def of_json_schema(cls, schema: dict[str, object] | str) -> Constraint:
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def of_json_object(cls) -> Constraint:
        return cls("json_object")

    @classmethod
    def of_regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def of_choice(cls, choices: Iterable[str]) -> Constraint:
        return cls("choice", choices=tuple(choices))

    @classmethod
    def of_lark(cls, grammar: str) -> Constraint:
        return cls("lark", grammar)


@dataclass(frozen=True)
class ThinkingBudget:
    """At most `budget` tokens of thinking (inference.proto `ThinkingBudget`; docs/daemon.md
    "Thinking budget"): once the think block holds that many tokens without a close, the daemon forces
    `close_token_id` as the next token and the model goes on to answer.

    The ids are the model's think markers, looked up by text in its tokenizer (for Qwen3 "<think>" and
    "</think>"; the gateway has the tokenizer, e.g. `tokenizer.token_to_id("</think>")`). A block the
    prompt leaves open (the generation prompt opened it) counts from the first generated token; a
    block the first generated token opens counts from the token after it. A forced close streams like
    any token, with logprob 0.0 and no top logprobs, and counts toward max_tokens; to resume a job,
    send its tokens (the forced close among them) as resume tokens, as always. With a constraint, the
    constraint applies to the answer after the close.

    Only the wire ranges are checked here; the daemon refuses equal ids, ids outside the vocabulary,
    a marker that is a stop token and a budget over 2^31 - 1 with `InvalidArgument` ("thinking....").

    Raises:
        InvalidArgument: a field that is not an integer within uint32, naming it.
    """

    budget: int
    open_token_id: int
    close_token_id: int

    def __post_init__(self) -> None:
        for name in ("budget", "open_token_id", "close_token_id"):
            check_integer(f"thinking.{name}", getattr(self, name), 0, UINT32_MAX)


@dataclass(frozen=True)
class SamplingParams:
    """How each token is drawn (inference.proto `SamplingParams`); None = the daemon's default.

    Attributes:
        seed: RNG seed, 0..2**64-1; None = the daemon picks one (`SubmitResult.seed` / `Generation.seed`).
        temperature: None = 1.0; 0 = greedy.
        top_k: keep the k most likely tokens; 0 = off.
        top_p: nucleus mass; None = 1.0 (off).
        min_p: drop tokens below min_p x the most likely one's probability; 0 = off.
        repetition_penalty: None = 1.0 (none).
        presence_penalty / frequency_penalty: OpenAI penalties; 0 = none.
        logprobs: None = none; N = the sampled token's logprob and the N most likely.
        constraint: None = none; else what the completion must match (`Constraint`).
        thinking: None = none; else a thinking budget (`ThinkingBudget`).

    Only what protobuf cannot carry is checked here (types, uint32/uint64 ranges); the daemon
    judges the values (temperature >= 0, 0 < top_p <= 1, logprobs <= 20, ...) and refuses with
    `InvalidArgument`.

    Raises:
        InvalidArgument: a field of the wrong type or outside its wire range, naming the field.
    """

    seed: int | None = None
    temperature: float | None = None
    top_k: int = 0
    top_p: float | None = None
    min_p: float = 0.0
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    constraint: Constraint | None = None
    thinking: ThinkingBudget | None = None

    def __post_init__(self) -> None:
        if self.thinking is not None and not isinstance(self.thinking, ThinkingBudget):
            raise InvalidArgument(
                f"thinking: must be a calculet.client.ThinkingBudget, got {type(self.thinking).__name__}"
            )
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise InvalidArgument(
                f"constraint: must be a calculet.client.Constraint, got {type(self.constraint).__name__}"
            )
        if self.seed is not None:
            check_integer("seed", self.seed, 0, UINT64_MAX)
        check_integer("top_k", self.top_k, 0, UINT32_MAX)
        if self.logprobs is not None:
            check_integer("logprobs", self.logprobs, 0, UINT32_MAX)
        for name in ("temperature", "top_p", "repetition_penalty"):
            value = getattr(self, name)
            if value is not None:
                check_number(name, value)
        for name in ("min_p", "presence_penalty", "frequency_penalty"):
            check_number(name, getattr(self, name))


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one sampled token and its most likely alternatives.

    Attributes:
        token: the sampled token id.
        logprob: its natural-log probability under the raw model logits.
        top: (token id, logprob) of the most likely tokens, by descending logprob.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenChunk:
    """Consecutive completion tokens that arrived together (one Wait event).

    Attributes:
        index: the event's index in the job's stream (0, 1, 2, ... without gaps).
        first_index: completion index of tokens[0] (len(resume_tokens) for a resumed job's first).
        tokens: the token ids, at least one.
        logprobs: empty unless logprobs were requested; then one entry per token.
    """

    index: int
    first_index: int
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


class FinishReason(Enum):
    """Why a job ended (inference.proto `FinishReason`)."""

    STOP = "stop"  # an EOS id or a stop token id was sampled
    LENGTH = "length"  # max_tokens reached or the context is full
    CANCELLED = "cancelled"  # Cancel or the daemon's orphan timeout
    ERROR = "error"  # FinalEvent.error says why (a deadline is DeadlineExceeded)


@dataclass(frozen=True)
class Usage:
    """Token counts of a finished job (completion_tokens includes resumed_tokens)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    resumed_tokens: int


@dataclass(frozen=True)
class Timings:
    """Seconds on the daemon's monotonic clock from Submit's acceptance (0 = phase never happened)."""

    queue_s: float
    prefill_s: float
    ttft_s: float
    decode_s: float
    e2e_s: float


@dataclass(frozen=True)
class FinalEvent:
    """The last event of a job.

    Attributes:
        index: the event's index in the job's stream.
        reason: why the job ended.
        usage / timings: counts and phase times.
        error: with reason ERROR, the typed error (Unavailable = resume elsewhere with
            resume_tokens; DeadlineExceeded, Overloaded, Aborted are final); else None.
        stop_token_id: with reason STOP, the token that stopped the job; else None.
        generation: model generation that produced the job's last token.
        recoveries: times the daemon transparently rebuilt the job's KV.
    """

    index: int
    reason: FinishReason
    usage: Usage
    timings: Timings
    error: CalculetError | None
    stop_token_id: int | None
    generation: int
    recoveries: int


Event = TokenChunk | FinalEvent


class ModelState(Enum):
    """Lifecycle state of a model alias (common.proto `ModelState`), values the lowercase names."""

    UNLOADED = "unloaded"
    VALIDATING = "validating"
    CONFIGURING = "configuring"
    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"
    UNLOADING = "unloading"
    FAILED = "failed"
    QUARANTINED = "quarantined"
    UNKNOWN = "unknown"  # unspecified, or a state this client does not know (a newer daemon)


class ServingStatus(Enum):
    """Whether a board (or a model) accepts new work (common.proto `ServingStatus`)."""

    SERVING = "serving"
    DRAINING = "draining"  # refuses new jobs, finishes the ones it has
    NOT_SERVING = "not_serving"


@dataclass(frozen=True)
class ModelInfo:
    """What GetModel returns: the manifest summary, state, tokenizer and chat template of an alias.

    Attributes:
        alias / generation / state: the alias, its current generation (0 = none) and lifecycle state.
        package_name / package_hash: package name and SHA-256 of its manifest.
        family / quantization: architecture family and quantization label.
        vocab_size: every token id must be below it.
        context: tokens a sequence may hold (prompt + completion).
        lanes: sequences that can run at once.
        eos_token_ids / bos_token_id / pad_token_id: special tokens (None = the tokenizer has none).
        model_max_length: tokenizer model_max_length clamped to `context`.
        tokenizer_json: the package's tokenizer.json, byte for byte (empty before validation).
        chat_template: Jinja2 chat template ("" if none).
        prefill_fixed_ms / prefill_ms_per_token: the package's declared prefill cost: n tokens take
            about fixed + n * per_token milliseconds on the device (0 = not declared).
        decode_step_ms: one decode step of one sequence at a short context (0 = not declared).
        prefill_chunk_tokens: longest prefill job; longer prompts run in chunks (0 = unknown).
    """

    alias: str
    generation: int
    state: ModelState
    package_name: str
    package_hash: str
    family: str
    quantization: str
    vocab_size: int
    context: int
    lanes: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int | None
    model_max_length: int
    tokenizer_json: bytes
    chat_template: str
    prefill_fixed_ms: float = 0.0
    prefill_ms_per_token: float = 0.0
    decode_step_ms: float = 0.0
    prefill_chunk_tokens: int = 0


@dataclass(frozen=True)
class ModelLoad:
    """One model's load figures in a `LoadReport`.

    Attributes:
        alias / generation / state: which model and where it is in its lifecycle.
        ready: Submit would be admitted now (READY on a SERVING board).
        queue_depth: jobs queued. running: jobs holding a lane.
        free_lanes / lanes_total: lanes FREE or PARKED / lanes of the current generation.
        parked_lanes: of free_lanes, those holding a finished conversation's KV.
        pending_prefill_tokens: prompt tokens still to prefill for jobs admitted there.
        prefix_hashes: chained block hashes of what the lanes hold (`calculet.common.prefix`);
            empty when prefix reuse is off.
        prefix_truncated: the daemon left blocks out to bound the report.
        package_hash: SHA-256 of the generation's manifest ("" when not reported).
        prefix_tips: each lane's last block hash: a prompt matching through one continues that lane.
        pending_short_prefill_tokens / short_prefill_tokens: of the pending prefill, short prefills'
            (served first), and the daemon's short bound (0 = not reported).
        queue_limit: requests that may wait for a lane beyond the free ones (the daemon's admission
            bound; 0 = not reported).
        prefix_reuse: the daemon reports its lanes' prefixes: prefix reuse is on for this generation
            (off: by setting, or its prefill is not proven to run at an offset; docs/daemon.md).
    """

    alias: str
    generation: int
    state: ModelState
    ready: bool
    queue_depth: int
    running: int
    free_lanes: int
    lanes_total: int
    parked_lanes: int = 0
    pending_prefill_tokens: int = 0
    prefix_hashes: frozenset[int] = frozenset()
    prefix_truncated: bool = False
    package_hash: str = ""
    prefix_tips: frozenset[int] = frozenset()
    pending_short_prefill_tokens: int = 0
    short_prefill_tokens: int = 0
    queue_limit: int = 0
    prefix_reuse: bool = True


@dataclass(frozen=True)
class LoadReport:
    """One WatchLoad message: a board's load, for routing.

    Attributes:
        board: the board's name.
        status: overall serving status.
        sequence: report number on this stream, from 0.
        models: one entry per known alias, sorted by alias.
    """

    board: str
    status: ServingStatus
    sequence: int
    models: tuple[ModelLoad, ...]


def check_integer(name: str, value: object, low: int, high: int) -> int:
    """Return `value` if it is an int (not a bool) in [low, high].

    Raises:
        InvalidArgument: otherwise, naming the field.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}: must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidArgument(f"{name}: must be in [{low}, {high}], got {value}")
    return value


def check_number(name: str, value: object) -> float:
    """Return `value` as a float if it is a real number (int or float, not a bool).

    Raises:
        InvalidArgument: otherwise, naming the field. (NaN and infinities pass: the daemon judges them.)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{name}: must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int beyond the float range
        raise InvalidArgument(f"{name}: {value} is beyond the float range") from None
