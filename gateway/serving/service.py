"""`GatewayService`: an OpenAI request, from parsed body to choice events, over the fleet.

Data flow: `prepare_chat` / `prepare_completion` check the model, pick the first board, fetch the
model's text there, render and tokenize the prompt, check it against the context, fix the seed,
and build one `ChoiceRunner` per choice — all before any byte of the response, so every refusal
gets its own HTTP status. `Prepared.events()` then yields `(choice index, event)` as they come.
Everything raises typed `CalculetError`s; the HTTP layer maps them in one place.

Seeds: the request's seed, or one drawn here, so that a failover can resend it. Choice i of a
request samples with seed + i (mod 2**64): the same request and seed give the same choices.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from calculet.client import SamplingParams
from calculet.daemon.errors import CalculetError, InvalidArgument, Unavailable
from calculet.gateway.api.schemas import ChatCompletionRequest, CompletionRequest
from calculet.gateway.errors import ModelNotFound
from calculet.gateway.fleet.board import Board
from calculet.gateway.fleet.connection import ChoiceSubmit
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.fleet.router import Router
from calculet.gateway.serving.choice import ChoiceEvent, ChoiceRunner, RetryPolicy
from calculet.gateway.serving.merge import merged
from calculet.gateway.serving.observer import NoObserver, ServingObserver
from calculet.gateway.serving.tracing import RequestScope
from calculet.gateway.text.model_text import ModelText

SEED_SPACE = 2**64
# Prompts longer than this (characters) are tokenized in a worker thread, off the event loop.
INLINE_TOKENIZE_CHARS = 4096


@dataclass
class Prepared:
    """A request ready to run: its model text, prompts and one runner per choice."""

    model: str
    text: ModelText
    prompt_tokens: list[list[int]]
    runners: list[ChoiceRunner]
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def prompt_token_count(self) -> int:
        """Usage's prompt_tokens: each prompt once, however many choices it has (as OpenAI counts)."""
        return sum(len(p) for p in self.prompt_tokens)

    def events(self) -> AsyncGenerator[tuple[int, ChoiceEvent], None]:
        return merged(self.runners)


class GatewayService:
    """The gateway's request logic over a fleet.

    Args:
        fleet / router: the boards and the routing rule.
        policy: retries and failover budget per choice.
        observer: told of retries and failovers (the app sets its metrics here).
    """

    def __init__(
        self, fleet: Fleet, router: Router, policy: RetryPolicy | None = None, observer: ServingObserver | None = None
    ) -> None:
        self.fleet = fleet
        self.router = router
        self.policy = policy or RetryPolicy()
        self.observer: ServingObserver = observer or NoObserver()

    async def prepare_chat(
        self, req: ChatCompletionRequest, session: str, scope: RequestScope | None = None
    ) -> Prepared:
        """`scope`: the request's id and trace (its attempts' Submit metadata).

        Raises: CalculetError (404 unknown model, 503 nothing serves it, 400 bad request)."""
        board, text = await self._model(req.model, session)
        messages = [m.template_view() for m in req.messages]
        prompt = text.render_chat(messages, add_generation_prompt=req.add_generation_prompt)
        tokens = await self._encode(text, prompt)
        limits = (req.token_limit(), req.logprobs_count())
        return self._prepare(req, session, board, text, [tokens], limits, "chatcmpl", scope)

    async def prepare_completion(
        self, req: CompletionRequest, session: str, scope: RequestScope | None = None
    ) -> Prepared:
        """Raises: CalculetError (as `prepare_chat`)."""
        prompts = req.prompts()
        board, text = await self._model(req.model, session)
        token_lists = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                token_lists.append(await self._encode(text, prompt))
            else:
                bad = next((t for t in prompt if not 0 <= t < text.facts.vocab_size), None)
                if bad is not None:
                    raise InvalidArgument(f"prompt[{i}]: token id {bad} is outside the vocabulary")
                token_lists.append(list(prompt))
        limits = (req.token_limit(), req.logprobs_count())
        return self._prepare(req, session, board, text, token_lists, limits, "cmpl", scope)

    async def model_context(self, alias: str) -> int:
        """The context length of `alias` as a serving board reports it (0 if none serves it now)."""
        for board in self.fleet.serving(alias):
            try:
                return (await self.fleet.model_text(board, alias)).facts.context  # cached after the first
            except CalculetError:
                continue
        return 0

    async def _model(self, alias: str, session: str) -> tuple[Board, ModelText]:
        board = self.router.pick(alias, session=session)
        if board is None:
            if alias in self.fleet.known_models():
                raise Unavailable(f"model {alias!r} is not ready on any board (loading, draining or unhealthy)")
            if not self.fleet.any_up():
                raise Unavailable("no board is reachable")  # it may well exist: nobody can say
            raise ModelNotFound(f"model {alias!r} does not exist on any board")
        return board, await self.fleet.model_text(board, alias)

    def _spread(self, alias: str, session: str, board: Board, text: ModelText) -> Board:
        """The first board of a further choice: the router's pick when it serves the same package."""
        other = self.router.pick(alias, session=session)
        if other is not None and self.fleet.cached_text(other, alias) is text:
            return other
        return board

    @staticmethod
    async def _encode(text: ModelText, prompt: str) -> list[int]:
        if len(prompt) > INLINE_TOKENIZE_CHARS:
            return await asyncio.to_thread(text.encode, prompt)
        return text.encode(prompt)

    def _prepare(
        self,
        req: ChatCompletionRequest | CompletionRequest,
        session: str,
        board: Board,
        text: ModelText,
        prompts: Sequence[list[int]],
        limits: tuple[int | None, int | None],
        id_prefix: str,
        scope: RequestScope | None,
    ) -> Prepared:
        """`limits`: (max_tokens, logprobs) of the request."""
        max_tokens, logprobs = limits
        context = text.facts.context
        for i, tokens in enumerate(prompts):
            where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            if not tokens:
                raise InvalidArgument(f"{where}: empty after tokenization")
            if len(tokens) >= context:
                raise InvalidArgument(
                    f"{where}: {len(tokens)} tokens; the model's context is {context} tokens "
                    "(prompt plus at least one completion token)"
                )
            if max_tokens is not None and len(tokens) + max_tokens > context:
                raise InvalidArgument(
                    f"max_tokens: {max_tokens} completion tokens after a {len(tokens)}-token prompt exceed "
                    f"the model's context of {context} tokens"
                )
        seed = secrets.randbits(63) if req.seed is None else req.seed % SEED_SPACE
        top_k = req.top_k if req.top_k is not None and req.top_k > 0 else 0
        runners: list[ChoiceRunner] = []
        for tokens in prompts:
            for i in range(req.n):
                sampling = SamplingParams(
                    seed=(seed + i) % SEED_SPACE,
                    temperature=req.temperature,
                    top_k=top_k,
                    top_p=req.top_p,
                    min_p=req.min_p,
                    repetition_penalty=req.repetition_penalty,
                    presence_penalty=req.presence_penalty,
                    frequency_penalty=req.frequency_penalty,
                    logprobs=logprobs,
                )
                job = ChoiceSubmit(
                    model=req.model,
                    prompt_tokens=tuple(tokens),
                    sampling=sampling,
                    max_tokens=max_tokens,
                    stop_token_ids=tuple(req.stop_token_ids or ()),
                    ignore_eos=req.ignore_eos,
                    priority=req.priority,
                    session_id=session,
                )
                first = self._spread(req.model, session, board, text) if runners else board
                runners.append(
                    ChoiceRunner(
                        self.fleet,
                        self.router,
                        text,
                        job,
                        req.stop_strings(),
                        first,
                        self.policy,
                        self.observer,
                        scope,
                    )
                )
        return Prepared(req.model, text, [list(p) for p in prompts], runners, f"{id_prefix}-{secrets.token_hex(12)}")
