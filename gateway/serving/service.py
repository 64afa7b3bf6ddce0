"""`GatewayService`: an OpenAI request, from parsed body to choice events, over the fleet.

Data flow: `prepare_chat` / `prepare_completion` find the boards serving the model, learn which
package each serves (`PackageCatalog.identify`: GetModel once per board generation), render and
tokenize the prompt once per package among them (normally one), check it against the context,
fix the seed, then place every choice on a board of the chosen package (`Router.place`: counted
on its board before anything awaits) and build one `ChoiceRunner` per choice — all before any
byte of the response, so every refusal gets its own HTTP status. `Prepared.events()` then yields
`(choice index, event)` as they come. Everything raises typed `CalculetError`s; the HTTP layer
maps them in one place.

Several packages of one alias (a rollout): a prompt that one package refuses (too long for its
context, its template refuses the messages) goes to another that takes it; among those that do,
the package whose best board ranks best by the routing policy serves the request (all its
choices, so one tokenizer renders every choice's text). When every package refuses, the refusal
of the package on the most boards is the answer.

Ownership: the placements belong to the runners from their creation; the `Prepared` owns the
runners until its events are read: `events()` (once started) or `close()` (when they never will
be) releases every placement still held.

Seeds: the request's seed, or one drawn here, so that a failover can resend it. Choice i of a
request samples with seed + i (mod 2**64): the same request and seed give the same choices.

Chat answers (docs/gateway.md, "Answer memory"): the service owns the gateway's `AnswerMemory`.
Chat choices remember the ids behind the text they returned (their runners are given the memory);
a chat prompt whose assistant messages are remembered is spliced (`text/answer_splice.py`): those
messages become the remembered ids, so the prompt starts with exactly what the previous turn's lane
holds. Hits, misses and fallbacks go to the observer. Text completions neither remember nor splice.

Chat tools and reasoning (docs/gateway.md, "Tools and reasoning"): the request's tools (unless
`tool_choice` is "none") and `chat_template_kwargs` go to the template; `Prepared.output` says how
the HTTP layer reads the answers (parse tool calls or not; whether the chosen package's prompt
ended inside an opened think block).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from calculet.client import Constraint, SamplingParams, ThinkingBudget
from calculet.common.errors import CalculetError, InvalidArgument, Overloaded, Unavailable
from calculet.gateway.api.schemas import ChatCompletionRequest, CompletionRequest
from calculet.gateway.api.thinking import DEFAULT_BUDGETS, free_thinking, thinking_budget
from calculet.gateway.api.tool_grammar import call_tags
from calculet.gateway.errors import ModelNotFound
from calculet.gateway.fleet.board import Board
from calculet.gateway.fleet.catalog import CatalogModel
from calculet.gateway.fleet.connection import ChoiceSubmit
from calculet.gateway.fleet.fleet import Fleet
from calculet.gateway.fleet.packages import ModelPackage
from calculet.gateway.placement.placer import ModelPlacer
from calculet.gateway.routing.router import Router
from calculet.gateway.routing.scoring.inputs import RouteRequest
from calculet.gateway.serving.choice import ChoiceEvent, ChoiceRunner, RetryPolicy
from calculet.gateway.serving.merge import merged
from calculet.gateway.serving.observer import NoObserver, ServingObserver
from calculet.gateway.serving.tracing import RequestScope
from calculet.gateway.text.answer_memory import AnswerMemory
from calculet.gateway.text.answer_splice import SplicedChat, splice_chat
from calculet.gateway.text.chat_output import OutputSpec
from calculet.gateway.text.model_text import ModelText
from calculet.gateway.text.reasoning import prompt_opens_thinking
from calculet.gateway.text.tokenize_pool import TokenizePool

SEED_SPACE = 2**64
# A prompt is refused untokenized when its characters exceed the context times the most characters
# a token stands for, times this: Unicode's canonical composition (NFC, which tokenizers normalize
# with) joins at most a few code points into one, so no prompt this long can fit.
CHARS_SAFETY_FACTOR = 4
# Retry-After of a request refused because its choices exceed what its boards admit now.
ADMISSION_RETRY_AFTER_S = 1.0

Tokenize = Callable[[ModelPackage], Awaitable[list[list[int]]]]
"""A request's prompts tokenized with one package's text (raises InvalidArgument when it cannot)."""


@dataclass
class Prepared:
    """A request ready to run: its package's text, prompts and one runner per choice.

    Runner i serves prompt i // choices_per_prompt (choices of one prompt are consecutive).
    """

    model: str
    text: ModelText
    prompt_tokens: list[list[int]]
    runners: list[ChoiceRunner]
    request_id: str
    choices_per_prompt: int = 1
    created: int = field(default_factory=lambda: int(time.time()))
    output: OutputSpec = field(default_factory=OutputSpec)
    """How chat answers are read (reasoning, tool calls); text completions leave the default."""

    @property
    def prompt_token_count(self) -> int:
        """Usage's prompt_tokens: each prompt once, however many choices it has (as OpenAI counts)."""
        return sum(len(p) for p in self.prompt_tokens)

    def cached_token_count(self, cached: Mapping[int, int]) -> int:
        """Usage's prompt_tokens_details.cached_tokens, counted like prompt_tokens: each prompt
        once, by its first choice's figure (capped at the prompt's length: after a failover the
        daemon's figure may include resumed tokens).

        Args:
            cached: choice index -> its `ChoiceEnd.cached_tokens` (choices that ended).
        Returns:
            The sum over prompts.
        """
        n = self.choices_per_prompt
        return sum(min(cached.get(i * n, 0), len(prompt)) for i, prompt in enumerate(self.prompt_tokens))

    def events(self) -> AsyncGenerator[tuple[int, ChoiceEvent], None]:
        """Every choice's events as they come; once started, closing it ends every choice and
        releases its placement."""
        return merged(self.runners)

    def close(self) -> None:
        """Release every placement a runner still holds (events never read, or cut short).
        Idempotent."""
        for runner in self.runners:
            runner.close()


@dataclass(frozen=True)
class ChatRender:
    """What a chat prompt is rendered from (the same for every package that may serve it)."""

    messages: Sequence[Mapping[str, Any]]
    add_generation_prompt: bool
    tools: Sequence[Mapping[str, Any]] | None = None
    template_kwargs: Mapping[str, Any] | None = None

    def prompt(self, text: ModelText) -> str:
        """The prompt text with `text`'s template. Raises: InvalidArgument (as `render_chat`)."""
        return text.render_chat(
            self.messages, self.add_generation_prompt, tools=self.tools, template_kwargs=self.template_kwargs
        )


class GatewayService:
    """The gateway's request logic over a fleet.

    Args:
        fleet / router: the boards and the routing rule.
        policy: retries and failover budget per choice.
        observer: told of retries, failovers and answer-memory use (the app sets its metrics here).
        answers: the chat answers' token memory (a default-sized one when not given; one with
            `max_tokens` 0 disables remembering and splicing).
        catalog: every model the fleet may serve (the gateway config's `[gateway.models]`).
        placer: placement by demand (None: `--placement off`, only operators load models); a
            request for a catalog model no board serves waits in its queue.
        tokenize: where long prompts are tokenized (a default `TokenizePool` when not given; the
            service closes it in `close`).
        thinking_budgets: the thinking tokens of each `reasoning_effort` (`api/thinking.py`).
    """

    def __init__(
        self,
        fleet: Fleet,
        router: Router,
        policy: RetryPolicy | None = None,
        observer: ServingObserver | None = None,
        answers: AnswerMemory | None = None,
        catalog: tuple[CatalogModel, ...] = (),
        placer: ModelPlacer | None = None,
        tokenize: TokenizePool | None = None,
        thinking_budgets: Mapping[str, int] = DEFAULT_BUDGETS,
    ) -> None:
        self.fleet = fleet
        self.tokenize = tokenize or TokenizePool()
        self.thinking_budgets = thinking_budgets
        self.catalog = catalog
        self.placer = placer
        self.router = router
        self.policy = policy or RetryPolicy()
        self.observer: ServingObserver = observer or NoObserver()
        self.answers = answers if answers is not None else AnswerMemory()

    def close(self) -> None:
        """End the tokenizer's threads (the app's lifespan calls it when the gateway stops)."""
        self.tokenize.close()

    async def prepare_chat(
        self, req: ChatCompletionRequest, session: str, scope: RequestScope | None = None
    ) -> Prepared:
        """`scope`: the request's id and trace (its attempts' Submit metadata).

        Raises: CalculetError (404 unknown model, 503 nothing serves it, 400 bad request)."""
        tools, parse_tools = req.template_tools()
        packages = await self._packages(req.model)
        messages = [m.template_view() for m in req.messages]
        render = ChatRender(messages, req.add_generation_prompt, tools, req.chat_template_kwargs)
        in_think: dict[ModelText, bool] = {}  # a package's text -> its prompt ended inside a think block

        async def tokenize(package: ModelPackage) -> list[list[int]]:
            ids, prompt = await self._chat_tokens(req.model, package, render)
            in_think[package.text] = prompt_opens_thinking(prompt)
            return [ids]

        answers = self.answers if self.answers.enabled else None
        prepared = await self._prepare(req, session, packages, tokenize, "chatcmpl", scope, answers)
        prepared.output = OutputSpec(
            in_think=in_think.get(prepared.text, False),
            parse_tools=parse_tools,
            parallel_tool_calls=req.parallel_tool_calls,
        )
        return prepared

    async def prepare_completion(
        self, req: CompletionRequest, session: str, scope: RequestScope | None = None
    ) -> Prepared:
        """Raises: CalculetError (as `prepare_chat`)."""
        prompts = req.prompts()
        packages = await self._packages(req.model)

        async def tokenize(package: ModelPackage) -> list[list[int]]:
            text = package.text
            token_lists = []
            for i, prompt in enumerate(prompts):
                if isinstance(prompt, str):
                    token_lists.append(await self.encode(text, prompt))
                    continue
                bad = next((t for t in prompt if not 0 <= t < text.facts.vocab_size), None)
                if bad is not None:
                    raise InvalidArgument(f"prompt[{i}]: token id {bad} is outside the vocabulary")
                token_lists.append(list(prompt))
            return token_lists

        return await self._prepare(req, session, packages, tokenize, "cmpl", scope)

    async def model_context(self, alias: str) -> int:
        """The context length of `alias` as a serving board reports it (0 if none serves it now)."""
        for board in self.fleet.serving(alias):
            try:
                return (await self.fleet.packages.of(board, alias)).text.facts.context  # cached after the first
            except CalculetError:
                continue
        return 0

    async def _packages(self, alias: str) -> list[tuple[ModelPackage, list[Board]]]:
        """The packages the boards serving `alias` run, each with its boards, the most boards first.

        Raises:
            ModelNotFound: no board knows the model (and some board is reachable).
            Unavailable: it is known but ready nowhere, no board is reachable, or no serving
                board answered GetModel.
            CalculetError: every serving board's GetModel failed: the first failure; from the
                placement queue (`ModelPlacer.wait_for_board`): 429, 503, 400.
        """
        boards = self.router.candidates(alias)
        placer = self.placer
        if placer is not None and alias in placer.catalog:
            if boards:
                placer.note_request(alias)
            else:
                await placer.wait_for_board(alias, lambda: bool(self.router.candidates(alias)))
                boards = self.router.candidates(alias)
        if not boards:
            if alias in self.fleet.known_models():
                raise Unavailable(f"model {alias!r} is not ready on any board (loading, draining or unhealthy)")
            if not self.fleet.any_up():
                raise Unavailable("no board is reachable")  # it may well exist: nobody can say
            raise ModelNotFound(f"model {alias!r} does not exist on any board")
        errors = await self.fleet.packages.identify(alias, boards)
        groups: dict[str, tuple[ModelPackage, list[Board]]] = {}
        for board in boards:
            package = self.fleet.packages.known(board, alias)
            if package is not None:
                groups.setdefault(package.package_hash, (package, []))[1].append(board)
        if not groups:
            raise errors[0] if errors else Unavailable(f"model {alias!r}: no serving board described it")
        return sorted(groups.values(), key=lambda group: -len(group[1]))

    async def _chat_tokens(self, alias: str, package: ModelPackage, render: ChatRender) -> tuple[list[int], str]:
        """A chat prompt's ids with `package`: the remembered answers spliced in when the template
        lets them be, else the plain rendering encoded as a whole (exactly as without the memory);
        and the rendered prompt text.

        Raises:
            InvalidArgument: the template refuses or fails on the messages.
        """
        text = package.text
        messages = render.messages
        prompt = render.prompt(text)
        if not self.answers.enabled:
            return await self.encode(text, prompt), prompt
        answers: dict[int, Sequence[int]] = {}
        misses = 0
        for i, message in enumerate(messages):
            content = message.get("content")
            if message.get("role") != "assistant" or not isinstance(content, str) or not content:
                continue
            ids = self.answers.recall(package.package_hash, content)
            if ids is None:
                misses += 1
            else:
                answers[i] = ids
        spliced = splice_chat(
            text, messages, render.add_generation_prompt, answers, prompt,
            tools=render.tools, template_kwargs=render.template_kwargs,
        )  # fmt: skip
        fallback = bool(answers) and spliced is None
        self.observer.answers_recalled(
            alias, spliced=spliced.spliced if spliced else 0, missed=misses, fallback=fallback
        )
        if spliced is None:
            return await self.encode(text, prompt), prompt
        return await self._encode_spliced(text, spliced), prompt

    async def encode(self, text: ModelText, prompt: str) -> list[int]:
        """`prompt`'s ids, on the tokenizer's threads.

        Raises: InvalidArgument (the prompt cannot fit), Overloaded (the tokenizer's budget)."""
        _check_chars(text, len(prompt))
        return await self.tokenize.run(len(prompt), lambda: text.encode(prompt))

    async def _encode_spliced(self, text: ModelText, spliced: SplicedChat) -> list[int]:
        """Raises: as `encode`."""
        _check_chars(text, spliced.text_chars)
        return await self.tokenize.run(spliced.text_chars, lambda: spliced.encode(text))

    async def _prepare(
        self,
        req: ChatCompletionRequest | CompletionRequest,
        session: str,
        packages: Sequence[tuple[ModelPackage, list[Board]]],
        tokenize: Tokenize,
        id_prefix: str,
        scope: RequestScope | None,
        answers: AnswerMemory | None = None,
    ) -> Prepared:
        """Tokenize once per package, pick the package, then place every choice (no await from
        the first placement on); `answers`: where chat choices remember their answers (None: not).

        Raises: InvalidArgument (every package refused the prompt), Unavailable (no board left)."""
        req.answer_constraint()  # a refusal of its fields comes before any tokenizing
        max_tokens = req.token_limit()
        options: list[tuple[ModelPackage, list[list[int]]]] = []
        refusal: InvalidArgument | None = None
        for package, _ in packages:
            try:
                prompts = await tokenize(package)
                _check_prompts(prompts, package.text.facts.context, max_tokens)
            except InvalidArgument as err:
                refusal = refusal or err
                continue
            options.append((package, prompts))
        if not options:
            raise refusal or Unavailable(f"model {req.model!r}: no package serves it")
        # From here on nothing awaits: the choices are counted on their boards as they are placed.
        package, prompts, routes = self._choose_package(req.model, session, options)
        boards = next(b for p, b in packages if p.package_hash == package.package_hash)
        _check_admission(req.model, boards, len(prompts) * req.n)
        runners = self._place_choices(req, session, package, list(zip(prompts, routes, strict=True)), scope, answers)
        rid = f"{id_prefix}-{secrets.token_hex(12)}"
        return Prepared(req.model, package.text, prompts, runners, rid, req.n)

    def _choose_package(
        self, alias: str, session: str, options: Sequence[tuple[ModelPackage, list[list[int]]]]
    ) -> tuple[ModelPackage, list[list[int]], list[RouteRequest]]:
        """The package whose best board ranks best for the first prompt, its prompts and their
        routing requests.

        Raises: Unavailable: no eligible board is left for any package (they went away meanwhile)."""
        best: tuple[float, ModelPackage, list[list[int]], list[RouteRequest]] | None = None
        for package, prompts in options:
            routes = [RouteRequest.build(alias, package.package_hash, tokens, session) for tokens in prompts]
            if len(options) == 1:
                return package, prompts, routes
            chosen = self.router.choose(routes[0])
            if chosen is None:
                continue
            rank = self.router.policy.rank(routes[0], chosen[1])
            if best is None or rank < best[0]:
                best = (rank, package, prompts, routes)
        if best is None:
            raise Unavailable(f"model {alias!r}: no board is left to serve it")
        return best[1], best[2], best[3]

    def _place_choices(
        self,
        req: ChatCompletionRequest | CompletionRequest,
        session: str,
        package: ModelPackage,
        prompts: Sequence[tuple[list[int], RouteRequest]],
        scope: RequestScope | None,
        answers: AnswerMemory | None,
    ) -> list[ChoiceRunner]:
        """One runner per choice (n per prompt), each with its placement, counted as placed; each
        remembers its answer in `answers` (if given) when it ends normally.

        Raises: Unavailable: no board left for the first choice (they went away meanwhile);
        InvalidArgument: a thinking budget asked of a package without think markers (before any
        placement)."""
        token_id = package.text.tokenizer.token_to_id
        constraint = req.answer_constraint(call_tags(token_id))  # one for every choice
        thinking = _thinking(req, self.thinking_budgets, token_id, constrained=constraint is not None)
        seed = secrets.randbits(63) if req.seed is None else req.seed % SEED_SPACE
        runners: list[ChoiceRunner] = []
        try:
            for tokens, route in prompts:
                for i in range(req.n):
                    job = _choice_job(req, session, tokens, (seed + i) % SEED_SPACE, constraint, thinking)
                    placement = self.router.place(route)
                    if placement is None:
                        raise Unavailable(f"model {req.model!r}: no board is left to serve it")
                    runner = ChoiceRunner(
                        self.fleet, self.router, package.text, job, req.stop_strings(), placement, self.policy,
                        self.observer, scope, route, answers,
                    )  # fmt: skip
                    runners.append(runner)
        except BaseException:
            for runner in runners:
                runner.close()
            raise
        return runners


def _thinking(
    req: ChatCompletionRequest | CompletionRequest,
    budgets: Mapping[str, int],
    token_id: Callable[[str], int | None],
    *,
    constrained: bool,
) -> ThinkingBudget | None:
    """The request's thinking budget with this package's markers (chat only): the one it asks, else
    for a constrained answer whose thinking is on an unbounded one (`api/thinking.py`).

    Raises: InvalidArgument."""
    if not isinstance(req, ChatCompletionRequest):
        return None
    asked = thinking_budget(req.thinking_token_budget, req.reasoning_effort, budgets, token_id)
    thinking_off = (req.chat_template_kwargs or {}).get("enable_thinking") is False
    if asked is not None or not constrained or thinking_off:
        return asked
    return free_thinking(token_id, req.stop_token_ids or ())


def _choice_job(
    req: ChatCompletionRequest | CompletionRequest,
    session: str,
    tokens: list[int],
    seed: int,
    constraint: Constraint | None,
    thinking: ThinkingBudget | None,
) -> ChoiceSubmit:
    """What one choice submits: the prompt's tokens and the request's limits, with its own seed, and
    the request's constraint and thinking budget (built once for all its choices)."""
    top_k = req.top_k if req.top_k is not None and req.top_k > 0 else 0
    sampling = SamplingParams(
        seed=seed,
        temperature=req.temperature,
        top_k=top_k,
        top_p=req.top_p,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logprobs=req.logprobs_count(),
        constraint=constraint,
        thinking=thinking,
    )
    return ChoiceSubmit(
        model=req.model,
        prompt_tokens=tuple(tokens),
        sampling=sampling,
        max_tokens=req.token_limit(),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        priority=req.priority,
        session_id=session,
    )


def _check_admission(alias: str, boards: Sequence[Board], choices: int) -> None:
    """A request of several choices is admitted as a unit: refused whole, before any is placed,
    when the boards of its package would not admit them all now (their lanes and admission
    queues, as their last reports and this gateway's placements since have them). Boards whose
    reports do not give their bound are not judged; a single choice is left to the router and its
    retries, as before.

    Raises:
        Overloaded: the choices exceed what the boards admit now (HTTP 429 with Retry-After).
    """
    if choices <= 1:
        return
    rooms = [b.admission_room(alias) for b in boards if b.can_serve(alias)]
    if not rooms or any(room is None for room in rooms):
        return
    room = sum(r for r in rooms if r is not None)
    if choices > room:
        raise Overloaded(
            f"model {alias!r}: this request needs {choices} jobs (prompts x n) and its boards admit "
            f"{room} now; send it in smaller parts or retry later",
            retry_after_s=ADMISSION_RETRY_AFTER_S,
        )


def _check_chars(text: ModelText, chars: int) -> None:
    """Raises: InvalidArgument: a prompt of `chars` characters cannot fit the context in any tokenization."""
    facts = text.facts
    if chars > facts.context * text.max_token_chars * CHARS_SAFETY_FACTOR:
        raise InvalidArgument(
            f"prompt: {chars} characters cannot fit the model's context of {facts.context} tokens "
            f"(a token stands for at most {text.max_token_chars} characters)"
        )


def _check_prompts(prompts: Sequence[list[int]], context: int, max_tokens: int | None) -> None:
    """Raises: InvalidArgument: a prompt is empty, or it (with max_tokens) does not fit the context."""
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
