"""Fakes for the gateway's fleet: `FakeDaemon` implements the same `DaemonConnection` ABC as the
real `ClientConnection`, with a deterministic "model" whose token at completion index i depends
only on (seed, prompt, i), as the daemon's counter-based sampling does. So a run that fails over
between fakes must give exactly the tokens of an undisturbed run, which is what the tests check.

Tokens are byte-level: ids 0..255 are the bytes, 256+ the specials (`<|im_end|>` = EOS = 257),
so generated text is readable ASCII and the real `Detokenizer`/`StopMatcher` run unchanged.

Prefix reuse: a fake's load reports advertise `prefix_hashes` (what its lanes would hold) and its
`pending_prefill_tokens`; its Finals count as cached the prompt (+ resume) tokens those hashes
cover, as a daemon reusing a parked lane would (`calculet.common.prefix`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from calculet.client.types import (
    FinalEvent,
    FinishReason,
    LoadReport,
    ModelInfo,
    ModelLoad,
    ModelState,
    ServingStatus,
    Timings,
    TokenChunk,
    TokenLogprob,
    Usage,
)
from calculet.common.errors import CalculetError, FailedPrecondition, NotFound, Unavailable
from calculet.common.prefix import BLOCK_TOKENS, block_hashes, cached_blocks
from calculet.gateway.fleet.connection import ChoiceSubmit, DaemonConnection, DaemonStream, ModelSwitch, SwitchDone

ALIAS = "fake"
CONTEXT = 512
EOS = 257
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.cache  # the same bytes for every fake board and test: built once a process
def byte_tokenizer_json() -> bytes:
    """A byte-level tokenizer without merges: id b = byte b; specials at 256.. ."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")])
    return tok.to_str().encode()


def script_text(daemon: FakeDaemon, text: str) -> None:
    """Make `daemon`'s model answer `text` (its UTF-8 bytes, a token each), then EOS."""
    daemon.script = tuple(text.encode("utf-8"))
    daemon.eos_at = len(daemon.script)


def _byte_of(ch: str) -> int:
    # GPT-2's byte -> unicode table: printable bytes map to themselves, the rest to 256+n.
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if ord(ch) in printable:
        return ord(ch)
    others = [b for b in range(256) if b not in printable]
    return others[ord(ch) - 256]


def model_token(seed: int, prompt: Sequence[int], index: int) -> int:
    """The fake model's token: printable ASCII from a hash of (seed, prompt, index)."""
    digest = hashlib.blake2b(f"{seed}|{list(prompt)}|{index}".encode(), digest_size=4).digest()
    return 32 + int.from_bytes(digest, "big") % 95


def cached_by(held: frozenset[int], tokens: Sequence[int]) -> int:
    """Tokens of `tokens` a board holding the block hashes `held` serves from KV (as the daemon
    counts `usage.cached_tokens`: whole blocks, the last token always prefilled)."""
    if len(tokens) <= 1:
        return 0
    return min(cached_blocks(block_hashes(tokens), held) * BLOCK_TOKENS, len(tokens) - 1)


def expected_tokens(job: ChoiceSubmit, count: int) -> list[int]:
    assert job.sampling.seed is not None
    return [model_token(job.sampling.seed, job.prompt_tokens, i) for i in range(count)]


@dataclass
class Submitted:
    job: ChoiceSubmit
    resume: tuple[int, ...]
    cancelled: bool = False
    metadata: tuple[tuple[str, str], ...] = ()


@dataclass
class FakeDaemon(DaemonConnection):
    """A board daemon in memory.

    Attributes:
        refuse: errors that the next `start` calls raise, in order.
        die_after: if set, the next stream breaks (Unavailable) after this many tokens and the
            daemon is dead from then on.
        eos_at: the completion index at which the model emits EOS (None = never).
        script: the tokens the model emits first, whatever the seed and prompt (then EOS when
            `eos_at` is their length): a scripted answer (`script_text` makes one of a text).
        step: an Event the stream waits on before each token when set (a test clock).
        package_hash: which package (tokenizer) this board serves.
        pending_prefill_tokens / prefix_hashes: what its load reports say (other gateways'
            prefill work; the block hashes its lanes hold).
        prefix_reuse: its reports carry prefix blocks (False: a board whose prefix reuse is off).
        prefill_fixed_ms / prefill_ms_per_token: the package's declared prefill cost (0 = none).
        context: the package's context (tokens a sequence may hold).
        chat_template: the package's chat template (ChatML by default).
        get_model_calls: GetModel calls answered.
        reports_package: its load reports name its package (ModelLoad.package_hash), as daemons do.
    """

    target: str
    ready: bool = True
    lanes: int = 4
    queue_depth: int = 0
    running: int = 0  # what its load reports say holds a lane (the fake runs nothing itself)
    queue_limit: int = 0  # its admission queue bound as its reports give it (0: not reported)
    refuse: list[CalculetError] = field(default_factory=list)
    die_after: int | None = None
    die_plan: list[int] | None = None  # shared between fakes: the next stream started anywhere pops
    eos_at: int | None = None
    script: tuple[int, ...] = ()
    step: asyncio.Semaphore | None = None
    package_hash: str = "pkg-a"
    pending_prefill_tokens: int = 0
    prefix_hashes: frozenset[int] = frozenset()
    prefix_reuse: bool = True
    prefill_fixed_ms: float = 0.0
    prefill_ms_per_token: float = 0.0
    context: int = CONTEXT
    chat_template: str = CHAT_TEMPLATE
    get_model_calls: int = 0
    reports_package: bool = False
    submitted: list[Submitted] = field(default_factory=list)
    switches: list[ModelSwitch] = field(default_factory=list)
    switch_answers: list[SwitchDone | CalculetError] = field(default_factory=list)
    closed: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _dead: bool = False

    # ---- what tests do --------------------------------------------------------------

    def set_ready(self, ready: bool) -> None:
        self.ready = ready
        self._poke()

    def report_now(self) -> None:
        """Send a load report at once (a real daemon sends one a second and on state changes)."""
        self._poke()

    def kill(self) -> None:
        """The process dies: every stream of it breaks."""
        self._dead = True
        self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- DaemonConnection -------------------------------------------------------------

    async def start(
        self, job: ChoiceSubmit, resume_tokens: Sequence[int], metadata: Sequence[tuple[str, str]] = ()
    ) -> DaemonStream:
        if self._dead:
            raise Unavailable(f"{self.target} is gone")
        if self.refuse:
            raise self.refuse.pop(0)
        if job.model != ALIAS:
            raise NotFound(f"model {job.model!r}")
        record = Submitted(job, tuple(resume_tokens), metadata=tuple(metadata))
        self.submitted.append(record)
        die_after, self.die_after = self.die_after, None
        if die_after is None and self.die_plan:
            die_after = self.die_plan.pop(0)
        return FakeStream(self, record, die_after)

    async def switch_model(self, switch: ModelSwitch) -> SwitchDone:
        """Records the switch; answers the next of `switch_answers` (refuses when there is none)."""
        self.switches.append(switch)
        answer = self.switch_answers.pop(0) if self.switch_answers else FailedPrecondition("fake boards do not switch")
        if isinstance(answer, CalculetError):
            raise answer
        return answer

    async def get_model(self, alias: str) -> ModelInfo:
        if self._dead:
            raise Unavailable(f"{self.target} is gone")
        if alias != ALIAS:
            raise NotFound(f"model {alias!r}")
        self.get_model_calls += 1
        return ModelInfo(
            alias=ALIAS, generation=1, state=ModelState.READY, package_name="fake", package_hash=self.package_hash,
            family="test", quantization="none", vocab_size=300, context=self.context, lanes=self.lanes,
            eos_token_ids=(EOS,), bos_token_id=None, pad_token_id=None, model_max_length=self.context,
            tokenizer_json=byte_tokenizer_json(), chat_template=self.chat_template,
            prefill_fixed_ms=self.prefill_fixed_ms, prefill_ms_per_token=self.prefill_ms_per_token,
        )  # fmt: skip

    async def watch_load(self) -> AsyncIterator[LoadReport]:  # type: ignore[override]
        seq = 0
        while not self._dead:
            changed = self._changed
            state = ModelState.READY if self.ready else ModelState.DRAINING
            free = max(0, self.lanes - self.running)
            model = ModelLoad(
                ALIAS, 1, state, self.ready, self.queue_depth, self.running, free, self.lanes,
                pending_prefill_tokens=self.pending_prefill_tokens, prefix_hashes=self.prefix_hashes,
                prefix_reuse=self.prefix_reuse,
                package_hash=self.package_hash if self.reports_package else "", queue_limit=self.queue_limit,
            )  # fmt: skip
            yield LoadReport(self.target, ServingStatus.SERVING, seq, (model,))
            seq += 1
            await changed.wait()
        raise Unavailable(f"{self.target} is gone")

    async def watch_health(self) -> AsyncIterator[ServingStatus]:  # type: ignore[override]
        while not self._dead:
            changed = self._changed
            yield ServingStatus.SERVING
            await changed.wait()
        raise Unavailable(f"{self.target} is gone")

    async def close(self) -> None:
        self.closed = True


class FakeStream(DaemonStream):
    def __init__(self, daemon: FakeDaemon, record: Submitted, die_after: int | None) -> None:
        self._daemon, self._record, self._die_after = daemon, record, die_after
        self._final: FinalEvent | None = None

    async def chunks(self) -> AsyncIterator[TokenChunk]:  # type: ignore[override]
        job, resume = self._record.job, self._record.resume
        seed = job.sampling.seed or 0
        limit = job.max_tokens if job.max_tokens is not None else self._daemon.context - len(job.prompt_tokens)
        index, sent = len(resume), 0
        while index < limit:
            if self._daemon.step is not None:
                await self._daemon.step.acquire()
            if self._daemon._dead or (self._die_after is not None and sent >= self._die_after):
                self._daemon._dead = True
                self._daemon._poke()
                raise Unavailable(f"{self._daemon.target}: stream broke")
            if self._record.cancelled:
                break
            if index < len(self._daemon.script):
                token = self._daemon.script[index]
            else:
                token = EOS if index == self._daemon.eos_at else model_token(seed, job.prompt_tokens, index)
            lps = (TokenLogprob(token, -0.5, ((token, -0.5),)),) if job.sampling.logprobs is not None else ()
            yield TokenChunk(sent, index, (token,), lps)
            index, sent = index + 1, sent + 1
            if token == EOS:
                break
            await asyncio.sleep(0)
        if not self._record.cancelled and self._die_after is not None and sent >= self._die_after:
            self._daemon._dead = True  # its last token went out, its Final never does
            self._daemon._poke()
            raise Unavailable(f"{self._daemon.target}: stream broke before its Final")
        reason = FinishReason.CANCELLED if self._record.cancelled else (
            FinishReason.STOP if index and index - 1 == self._daemon.eos_at else FinishReason.LENGTH
        )  # fmt: skip
        cached = cached_by(self._daemon.prefix_hashes, (*job.prompt_tokens, *resume))
        self._final = FinalEvent(
            sent, reason, Usage(len(job.prompt_tokens), index, cached, len(resume)), Timings(0, 0, 0, 0, 0), None,
            EOS if reason is FinishReason.STOP else None, 1, 0,
        )  # fmt: skip

    @property
    def final(self) -> FinalEvent | None:
        return self._final

    async def cancel(self) -> None:
        self._record.cancelled = True

    async def aclose(self) -> None:
        return None
