"""The answer memory in the service, over fake boards: which chat answers are remembered (ended on
a token or at their length, no stop string cut, each choice its own, chat only), and how the next
turn is prepared (remembered ids spliced, everything else encoded exactly as before, a transforming
template falling back, the context checked on the spliced ids)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import pytest

from calculet.client.types import FinishReason
from calculet.common.errors import InvalidArgument
from calculet.gateway.api.schemas import ChatCompletionRequest
from calculet.gateway.serving.choice import answer_ids
from calculet.gateway.serving.observer import ServingObserver
from calculet.gateway.serving.service import GatewayService
from calculet.gateway.text.answer_memory import AnswerMemory
from calculet.gateway.text.model_text import ModelFacts, ModelText
from tests.unit.gateway.fakes import ALIAS, CHAT_TEMPLATE, CONTEXT, EOS, FakeDaemon, byte_tokenizer_json
from tests.unit.gateway.harness import completion, run_all, start_service

PACKAGE = "pkg-a"
PADDING = 299  # past the byte tokenizer's ids, below the model's vocab: decodes to nothing
TEXT = ModelText(ModelFacts(ALIAS, PACKAGE, 300, CONTEXT, (EOS,)), byte_tokenizer_json(), CHAT_TEMPLATE)
QUESTION = {"role": "user", "content": "Tell me about lanes."}
MEMORY_TOKENS = 100_000
FOLLOW_UP = {"role": "user", "content": "And parking?"}


class Recorder(ServingObserver):
    """Keeps every `answers_recalled` call as (model, spliced, missed, fallback)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, bool]] = []

    def answers_recalled(self, model: str, *, spliced: int, missed: int, fallback: bool) -> None:
        self.calls.append((model, spliced, missed, fallback))


def chat(messages: Sequence[dict[str, str]], **fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest(model=ALIAS, messages=list(messages), **fields)  # type: ignore[arg-type]


def run(scenario: Callable[[GatewayService, FakeDaemon], Awaitable[None]], daemon: FakeDaemon | None = None) -> None:
    """`scenario(service, daemon)` on one fake board, the service's observer a `Recorder`."""

    async def main() -> None:
        board = daemon or FakeDaemon("a")
        fleet, service = await start_service(board)
        service.answers = AnswerMemory(MEMORY_TOKENS)  # opt-in (off by default)
        service.observer = Recorder()
        try:
            await scenario(service, board)
        finally:
            await fleet.close()

    asyncio.run(main())


def recorded(service: GatewayService) -> list[tuple[str, int, int, bool]]:
    assert isinstance(service.observer, Recorder)
    return service.observer.calls


def plain_ids(messages: Sequence[dict[str, str]]) -> list[int]:
    return TEXT.encode(TEXT.render_chat(messages))


# ---- what is remembered ----------------------------------------------------------------


def test_an_answer_that_ends_on_eos_is_remembered_without_the_eos() -> None:
    async def scenario(service: GatewayService, _board: FakeDaemon) -> None:
        texts, ends, tokens = await run_all(await service.prepare_chat(chat([QUESTION], max_tokens=20, seed=1), ""))
        # The EOS (the 6th token) is generated and counted, but has no text, so no delta shows it.
        assert ends[0].finish_reason == "stop" and ends[0].completion_tokens == 6 and len(tokens[0]) == 5
        assert list(service.answers.recall(PACKAGE, texts[0]) or []) == tokens[0]
        assert service.answers.entries == 1 and service.answers.tokens == 5

    run(scenario, FakeDaemon("a", eos_at=5))


def test_an_answer_cut_at_its_length_is_remembered_whole() -> None:
    async def scenario(service: GatewayService, _board: FakeDaemon) -> None:
        texts, ends, tokens = await run_all(await service.prepare_chat(chat([QUESTION], max_tokens=6, seed=1), ""))
        assert ends[0].finish_reason == "length" and len(tokens[0]) == 6
        assert list(service.answers.recall(PACKAGE, texts[0]) or []) == tokens[0]

    run(scenario)


def test_an_answer_cut_by_a_stop_string_is_not_remembered() -> None:
    async def scenario(service: GatewayService, daemon: FakeDaemon) -> None:
        request = chat([QUESTION], max_tokens=12, seed=2)
        texts, _, _ = await run_all(await service.prepare_chat(request, ""))
        service.answers = AnswerMemory(1000)  # forget the probe
        stopped = request.model_copy(update={"stop": [texts[0][4:6]]})
        cut, ends, _ = await run_all(await service.prepare_chat(stopped, ""))
        assert ends[0].finish_reason == "stop" and daemon.submitted[-1].cancelled
        assert cut[0] == texts[0][:4]
        assert service.answers.entries == 0 and service.answers.recall(PACKAGE, cut[0]) is None
        await run_all(await service.prepare_chat(request, ""))  # the control: uncut, it is remembered
        assert service.answers.recall(PACKAGE, texts[0]) is not None

    run(scenario)


def test_each_choice_remembers_its_own_text() -> None:
    async def scenario(service: GatewayService, _board: FakeDaemon) -> None:
        texts, _, tokens = await run_all(await service.prepare_chat(chat([QUESTION], max_tokens=8, seed=5, n=2), ""))
        assert texts[0] != texts[1]
        for i in (0, 1):
            assert list(service.answers.recall(PACKAGE, texts[i]) or []) == tokens[i]
        assert (service.answers.entries, service.answers.tokens) == (2, 16)

    run(scenario)


def test_text_completions_are_not_remembered() -> None:
    async def scenario(service: GatewayService, _board: FakeDaemon) -> None:
        texts, _, _ = await run_all(await service.prepare_completion(completion("Hello", max_tokens=6, seed=1), ""))
        assert texts[0] and service.answers.entries == 0

    run(scenario)


@pytest.mark.parametrize(
    ("tokens", "reason", "expected"),
    [
        ([5, 6, EOS], FinishReason.STOP, [5, 6]),  # the stop token: the template renders the end itself
        ([5, 6, 7], FinishReason.STOP, [5, 6, 7]),  # nothing to drop (it was not a stop id)
        ([5, 6, EOS], FinishReason.LENGTH, [5, 6, EOS]),  # at the length every token was the answer's
        ([5, 6], FinishReason.CANCELLED, None),
        ([5, 6], FinishReason.ERROR, None),
    ],
)
def test_answer_ids(tokens: list[int], reason: FinishReason, expected: list[int] | None) -> None:
    ids = answer_ids(tokens, reason, frozenset({EOS, 9}))
    assert (list(ids) if ids is not None else None) == expected


# ---- how the next turn is prepared -------------------------------------------------------


def test_the_next_turn_is_the_previous_prompt_then_the_answers_ids() -> None:
    async def scenario(service: GatewayService, daemon: FakeDaemon) -> None:
        first = await service.prepare_chat(chat([QUESTION], max_tokens=20, seed=1), "")
        first_prompt = first.prompt_tokens[0]
        texts, _, tokens = await run_all(first)
        messages = [QUESTION, {"role": "assistant", "content": texts[0]}, FOLLOW_UP]
        second = await service.prepare_chat(chat(messages, max_tokens=4, seed=2), "")
        await run_all(second)
        rest = TEXT.render_chat(messages)[len(TEXT.render_chat([QUESTION])) + len(texts[0]) :]
        expected = [*first_prompt, *tokens[0], *TEXT.encode(rest)]  # tokens[0]: the answer without its EOS
        assert list(daemon.submitted[-1].job.prompt_tokens) == second.prompt_tokens[0] == expected
        assert recorded(service) == [(ALIAS, 0, 0, False), (ALIAS, 1, 0, False)]

    run(scenario, FakeDaemon("a", eos_at=5))


def test_remembered_ids_replace_the_text_where_encoding_would_differ() -> None:
    async def scenario(service: GatewayService, daemon: FakeDaemon) -> None:
        produced = [72, 105, PADDING, 33]  # "Hi!" with a padding id the text does not show
        service.answers.remember(PACKAGE, "Hi!", produced)
        messages = [QUESTION, {"role": "assistant", "content": "Hi!"}, FOLLOW_UP]
        prepared = await service.prepare_chat(chat(messages, max_tokens=4, seed=2), "")
        await run_all(prepared)
        head = TEXT.render_chat([QUESTION])
        rest = TEXT.render_chat(messages)[len(head) + len("Hi!") :]
        expected = [*TEXT.encode(head), *produced, *TEXT.encode(rest)]
        assert list(daemon.submitted[-1].job.prompt_tokens) == expected != plain_ids(messages)
        assert prepared.prompt_token_count == len(expected)
        assert recorded(service) == [(ALIAS, 1, 0, False)]

    run(scenario)


def test_prompts_without_a_remembered_answer_tokenize_exactly_as_before() -> None:
    async def scenario(service: GatewayService, daemon: FakeDaemon) -> None:
        service.answers.remember(PACKAGE, "Something else.", [1, 2, 3])
        for messages in (
            [QUESTION],
            [QUESTION, {"role": "assistant", "content": "Never said."}, FOLLOW_UP],
            [QUESTION, {"role": "assistant", "content": ""}, FOLLOW_UP],
        ):
            await run_all(await service.prepare_chat(chat(messages, max_tokens=2, seed=2), ""))
            assert list(daemon.submitted[-1].job.prompt_tokens) == plain_ids(messages)
        assert recorded(service) == [(ALIAS, 0, 0, False), (ALIAS, 0, 1, False), (ALIAS, 0, 0, False)]

    run(scenario)


def test_a_template_that_transforms_content_falls_back_to_the_plain_encoding() -> None:
    upper = CHAT_TEMPLATE.replace("{{ m['content'] }}", "{{ m['content'] | upper }}")
    assert upper != CHAT_TEMPLATE
    shouting = ModelText(TEXT.facts, byte_tokenizer_json(), upper)

    async def scenario(service: GatewayService, daemon: FakeDaemon) -> None:
        service.answers.remember(PACKAGE, "Hi!", [72, 105, PADDING, 33])
        messages = [QUESTION, {"role": "assistant", "content": "Hi!"}, FOLLOW_UP]
        await run_all(await service.prepare_chat(chat(messages, max_tokens=2, seed=2), ""))
        assert list(daemon.submitted[-1].job.prompt_tokens) == shouting.encode(shouting.render_chat(messages))
        assert recorded(service) == [(ALIAS, 0, 0, True)]

    run(scenario, FakeDaemon("a", chat_template=upper))


def test_the_context_checks_use_the_spliced_ids() -> None:
    async def scenario(service: GatewayService, _board: FakeDaemon) -> None:
        long_text, long_ids = "x" * (CONTEXT + 10), [120] * (CONTEXT + 10)
        service.answers.remember(PACKAGE, long_text, [120])  # the text is long, its ids are not
        service.answers.remember(PACKAGE, "y", long_ids)  # the text is short, its ids are not
        fits = [QUESTION, {"role": "assistant", "content": long_text}, FOLLOW_UP]
        assert len(plain_ids(fits)) > CONTEXT
        prepared = await service.prepare_chat(chat(fits, max_tokens=2, seed=2), "")
        assert prepared.prompt_token_count < 100
        await run_all(prepared)
        too_long = [QUESTION, {"role": "assistant", "content": "y"}, FOLLOW_UP]
        assert len(plain_ids(too_long)) < 100
        with pytest.raises(InvalidArgument, match="context"):
            await service.prepare_chat(chat(too_long, max_tokens=2, seed=2), "")

    run(scenario)


def test_a_zero_bound_neither_remembers_nor_splices() -> None:
    async def scenario(service: GatewayService, daemon: FakeDaemon) -> None:
        service.answers = AnswerMemory(0)
        texts, _, _ = await run_all(await service.prepare_chat(chat([QUESTION], max_tokens=6, seed=1), ""))
        assert service.answers.entries == 0
        messages = [QUESTION, {"role": "assistant", "content": texts[0]}, FOLLOW_UP]
        await run_all(await service.prepare_chat(chat(messages, max_tokens=2, seed=2), ""))
        assert list(daemon.submitted[-1].job.prompt_tokens) == plain_ids(messages)
        assert recorded(service) == []

    run(scenario)
