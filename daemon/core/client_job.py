"""One client job inside the daemon (a Submit): its tokens, lane, state and output log.

Ownership: the engine owns every `ClientJob` and mutates it only under its lock. Its `lane` is held
by the sequence between the scheduler's assignment and release (the KV manager records the same
owner). While WAITING / READY / RECOVER it sits in the scheduler's sets; while a device job carrying
it is in flight (PREFILL or DECODE) that `DeviceJob` holds it and nothing else changes its tokens or
lane until the job's completion is applied.

KV invariant while READY: the lane holds `prompt + generated[:-1]`, and `generated[-1]` is the
next decode input. A (re-)prefill feeds `prompt + generated` and samples the next token from
its logits, which restores the invariant; that is how resumed and recovered sequences continue
with exactly the tokens of an undisturbed run (sampling is keyed by (seed, step)).

In every state the lane's committed KV holds `prefill_tokens[:length]` (length from the KV
manager). A prefill starts at that length: 0 on a cold lane, the kept prefix on a parked lane it
took, the chunks done so far while PARTIAL. A prefill longer than the model's chunk runs as several
device jobs; between them the sequence is PARTIAL and no token is sampled. A jump-forward
(`jump.py`) leaves it PARTIAL too: its tokens grew by a forced run that its lane does not hold yet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from enum import Enum, auto

import numpy as np

from calculet.common.errors import ErrorKind
from calculet.common.lifecycle import Lifecycle, table
from calculet.common.prefix import BLOCK_TOKENS, block_hashes
from calculet.daemon.core.events import EventLog, FinishReason, Timings, TokenLogprob, Usage
from calculet.daemon.core.request import GenerationRequest
from calculet.daemon.grammar import GrammarMatcher
from calculet.daemon.sampling.history import TokenHistory
from calculet.daemon.sampling.thinking import ThinkingTracker, ThinkPhase


class SeqState(Enum):
    WAITING = auto()  # queued for admission, no lane
    PREFILL = auto()  # prefill job in flight
    READY = auto()  # has a lane, waiting for its next decode job
    DECODE = auto()  # decode job in flight
    RECOVER = auto()  # lane KV lost; waiting for a re-prefill
    PARTIAL = auto()  # has a lane holding part of its prefill; waiting for the next prefill chunk (or a jump's)
    DONE = auto()


SEQ_TRANSITIONS = table(
    [
        (SeqState.WAITING, [SeqState.PREFILL, SeqState.DONE]),
        (SeqState.PREFILL, [SeqState.READY, SeqState.PARTIAL, SeqState.RECOVER, SeqState.DONE]),
        (SeqState.PARTIAL, [SeqState.PREFILL, SeqState.RECOVER, SeqState.DONE]),
        (SeqState.READY, [SeqState.DECODE, SeqState.RECOVER, SeqState.DONE]),
        (SeqState.DECODE, [SeqState.READY, SeqState.PARTIAL, SeqState.RECOVER, SeqState.DONE]),
        (SeqState.RECOVER, [SeqState.PREFILL, SeqState.DONE]),
    ]
)


@dataclass(frozen=True)
class ProbeShape:
    """How a warm-up probe of the offset check runs (`offset_probe.py`); a client job has none.

    Attributes:
        chunk: tokens per prefill job of this probe (0: the model's chunk), so its prompt runs in pieces.
        park: park its lane when it ends, as a client's would be, for the next probe to continue.
        keep: take the parked lane whose history it continues, truncated to at most this many KV
            tokens (0: take a lane cold, as every other probe).
    """

    chunk: int = 0
    park: bool = False
    keep: int = 0


class ClientJob:
    """A request being served. Mutated only by the engine under its lock."""

    def __init__(self, job_id: str, request: GenerationRequest, generation: int, eos_ids: frozenset[int]) -> None:
        self.job_id = job_id
        self.request = request
        self.generation = generation
        self.log = EventLog(job_id, start_token_index=len(request.resume_tokens))
        self.lifecycle: Lifecycle[SeqState] = Lifecycle(f"job {job_id}", SeqState.WAITING, SEQ_TRANSITIONS)
        self.generated: list[int] = list(request.resume_tokens)
        self.lane: int | None = None
        self.cancel_requested = False
        # An error to report instead of CANCELLED when the cancel came from unload/drain.
        self.pending_error: tuple[FinishReason, ErrorKind | None, str] | None = None
        self.recoveries = 0
        self.nonfinite = 0  # device jobs whose logits for it were NaN/Inf (a golden re-check judges them)
        self.cached_tokens = 0  # prompt (+ resumed) tokens a parked lane held at admission (usage)
        self._block_hashes: list[int] = []  # chained hashes of prefill_tokens' first blocks (a cache)
        self._array: np.ndarray | None = None  # prefill_array's cache
        self.expected_uncached = 0  # prefill tokens no parked lane held when it was queued (its class)
        self.history: TokenHistory | None = None  # penalties' view of prompt + generated (engine sets it)
        # The constraint's matcher over `generated` (engine sets it; owned by this sequence, consumed in
        # `accept` only, so a lost or cancelled step never advances it).
        self.grammar: GrammarMatcher | None = None
        # The thinking budget's tracker (engine sets it; owned by this sequence, advanced in `accept`
        # only). While it is THINKING the matcher is not consulted: a constraint applies to the answer.
        self.thinking: ThinkingTracker | None = None
        self.capture_logits = False  # warm-up probes keep the first step's logits
        self.internal = False  # a warm-up probe, not a client request (not counted in Status)
        self.probe: ProbeShape | None = None  # the offset check's shape of an internal probe
        self.first_logits: np.ndarray | None = None
        self.stop_ids = frozenset(request.stopping.stop_token_ids) | (
            frozenset() if request.stopping.ignore_eos else eos_ids
        )
        now = time.monotonic()
        self.t_submit = now
        self.t_admit: float | None = None
        self.t_first: float | None = None
        self.deadline = now + request.deadline_s if request.deadline_s is not None else None

    def release_inputs(self) -> None:
        """Drop what only a running job reads, once it is DONE and retained (`JobTable.retire`).

        A retained job answers Wait from its log, Cancel and `job_generation` from its ids, a
        Submit retry from its request's seed, and a warm-up probe from `generated` and
        `first_logits`; all of these stay. Its prompt (a tuple of ints: a long prompt's is most of
        what retention would keep, for the retention age), the prefix caches, the penalties'
        history, the grammar matcher and the thinking tracker go. Keeping them made a board's
        memory follow the largest set of prompts it had retained (docs/reliability.md).
        """
        assert self.state is SeqState.DONE, f"job {self.job_id}: inputs released while {self.state.name}"
        self.request = replace(self.request, prompt_tokens=(), resume_tokens=())
        self._block_hashes = []
        self._array = None
        self.history = None
        self.grammar = None
        self.thinking = None

    @property
    def state(self) -> SeqState:
        return self.lifecycle.state

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt_tokens

    @property
    def prefill_tokens(self) -> list[int]:
        """Tokens a (re-)prefill feeds: the prompt and every completion token so far."""
        return [*self.request.prompt_tokens, *self.generated]

    def prefill_slice(self, start: int, end: int) -> list[int]:
        """`prefill_tokens[start:end]` without building the whole list (a chunk of a long prompt)."""
        prompt = self.request.prompt_tokens
        head = list(prompt[start:end])
        if end > len(prompt):
            head += self.generated[max(0, start - len(prompt)) : end - len(prompt)]
        return head

    def prefill_array(self) -> np.ndarray:
        """`prefill_tokens` as an int32 array (the prefix matcher's and a parked lane's form), built
        once per length (admission reads it twice: to classify the request, then to match it)."""
        length = len(self.prompt) + len(self.generated)
        if self._array is None or len(self._array) != length:
            self._array = np.fromiter(self.prefill_tokens, dtype=np.int32, count=length)
        return self._array

    def block_hashes(self, tokens: int) -> list[int]:
        """Chained hashes of the full blocks of `prefill_tokens[:tokens]` (`calculet.common.prefix`),
        computed once per block and kept: prefill tokens only ever grow."""
        blocks = min(tokens, len(self.prompt) + len(self.generated)) // BLOCK_TOKENS
        known = self._block_hashes
        if blocks > len(known):
            known += block_hashes(self.prefill_tokens[: blocks * BLOCK_TOKENS], start=len(known),
                                  prev=known[-1] if known else 0)  # fmt: skip
        return known[:blocks]

    def seed_block_hashes(self, hashes: tuple[int, ...]) -> None:
        """Start the hash cache from a parked lane's hashes of the prefix this sequence shares."""
        if not self._block_hashes:
            self._block_hashes = list(hashes)

    @property
    def kv_len_when_ready(self) -> int:
        return len(self.request.prompt_tokens) + len(self.generated) - 1

    @property
    def step(self) -> int:
        """RNG counter of the next token: how many completion tokens exist already."""
        return len(self.generated)

    @property
    def remaining(self) -> int:
        return self.request.stopping.max_tokens - len(self.generated)

    @property
    def answer_grammar(self) -> GrammarMatcher | None:
        """The matcher if it may constrain the next token: None inside a think block (docs/daemon.md
        "Thinking budget"). While the first token may still open a block, the caller allows the open
        token besides the matcher's (`completion.row_masks`)."""
        if self.thinking is not None and self.thinking.phase is ThinkPhase.THINKING:
            return None
        return self.grammar

    def stop_reason_after(self, token: int) -> FinishReason | None:
        """Whether accepting `token` would end generation, and why (no change)."""
        if token in self.stop_ids:
            return FinishReason.STOP
        if self.remaining <= 1:
            return FinishReason.LENGTH
        return None

    def accept(self, token: int, logprob: TokenLogprob | None) -> None:
        """Record a sampled (or forced) token and stream it."""
        self.generated.append(token)
        if self.history is not None:
            self.history.append(token)
        if self.grammar is not None and (self.thinking is None or self.thinking.is_answer(token)):
            self.grammar.consume(token)
        if self.thinking is not None:
            self.thinking.observe(token)
        if self.t_first is None:
            self.t_first = time.monotonic()
        self.log.append_tokens((token,), (logprob,) if logprob is not None else ())

    def finish(
        self,
        reason: FinishReason,
        error_kind: ErrorKind | None = None,
        message: str = "",
        retry_after_s: float | None = None,
    ) -> bool:
        """Move to DONE and write the final event (first call wins); `retry_after_s` is an
        OVERLOADED Final's retry hint."""
        if self.state is not SeqState.DONE:
            self.lifecycle.move(SeqState.DONE)
        self.grammar = None  # a finished job keeps no parser state through its retention
        return self.log.finish(reason, self.usage(), self.timings(), error_kind, message, retry_after_s)

    def usage(self) -> Usage:
        resumed = len(self.request.resume_tokens)
        return Usage(len(self.request.prompt_tokens), len(self.generated), resumed, self.cached_tokens)

    def timings(self) -> Timings:
        now = time.monotonic()
        admit = self.t_admit if self.t_admit is not None else now
        first = self.t_first if self.t_first is not None else now
        return Timings(
            queue=admit - self.t_submit,
            prefill=max(0.0, first - admit) if self.t_first is not None else 0.0,
            ttft=first - self.t_submit if self.t_first is not None else 0.0,
            decode=now - first if self.t_first is not None else 0.0,
            e2e=now - self.t_submit,
        )
