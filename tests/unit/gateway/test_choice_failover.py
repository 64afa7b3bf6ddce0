"""ChoiceRunner over fake boards: retries before the first token, mid-stream failover with
resume_tokens that keeps the text identical to an undisturbed run, stop strings, EOS, cancel."""

from __future__ import annotations

import asyncio

import pytest

from calculet.common.errors import ErrorKind, InvalidArgument, Overloaded, Unavailable
from calculet.gateway.errors import ModelNotFound
from calculet.gateway.serving.choice import RetryPolicy
from tests.unit.gateway.fakes import CONTEXT, FakeDaemon, model_token
from tests.unit.gateway.harness import chat, completion, run_all, start_service, until

PROMPT = [72, 105, 33]  # "Hi!"


def expected_text(seed: int, count: int, prompt: list[int] = PROMPT) -> str:
    return bytes(model_token(seed, prompt, i) for i in range(count)).decode()


def test_undisturbed_run_gives_the_models_tokens() -> None:
    async def scenario() -> None:
        fleet, service = await start_service(FakeDaemon("a"))
        texts, ends, _ = await run_all(await service.prepare_completion(completion(PROMPT, max_tokens=20, seed=7), ""))
        assert texts[0] == expected_text(7, 20)
        assert ends[0].finish_reason == "length" and ends[0].completion_tokens == 20
        await fleet.close()

    asyncio.run(scenario())


def test_failover_mid_stream_continues_with_resume_tokens_and_identical_text() -> None:
    async def scenario() -> None:
        plan = [7]  # whichever board gets the job first dies after 7 tokens
        a, b = FakeDaemon("a", die_plan=plan), FakeDaemon("b", die_plan=plan)
        fleet, service = await start_service(a, b)
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=30, seed=11), "")
        texts, ends, _ = await run_all(prepared)
        assert texts[0] == expected_text(11, 30)
        assert ends[0].completion_tokens == 30 and ends[0].finish_reason == "length"
        first, second = (a, b) if a.submitted and not a.submitted[0].resume else (b, a)
        assert [s.resume for s in first.submitted] == [()]
        expected_resume = tuple(model_token(11, PROMPT, i) for i in range(7))
        assert [s.resume for s in second.submitted] == [expected_resume]
        assert second.submitted[0].job == first.submitted[0].job  # same seed, prompt, limits
        assert prepared.runners[0].failovers == 1
        await fleet.close()

    asyncio.run(scenario())


def test_a_stream_lost_after_its_last_token_ends_without_a_resume() -> None:
    """The board died after the choice's last token but before its Final: nothing is left to
    generate, so the choice ends "length" here (a resume of max_tokens tokens is refused; the fault
    soak once failed a request on it)."""

    async def scenario() -> None:
        plan = [7]
        a, b = FakeDaemon("a", die_plan=plan), FakeDaemon("b", die_plan=plan)
        fleet, service = await start_service(a, b)
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=7, seed=11), "")
        texts, ends, _ = await run_all(prepared)
        assert texts[0] == expected_text(11, 7)
        assert ends[0].completion_tokens == 7 and ends[0].finish_reason == "length"
        assert len(a.submitted) + len(b.submitted) == 1, "no resume was submitted"
        await fleet.close()

    asyncio.run(scenario())


def test_mid_stream_failover_waits_for_a_board_to_come_up() -> None:
    async def scenario() -> None:
        a, b = FakeDaemon("a", die_after=5), FakeDaemon("b", ready=False)
        fleet, service = await start_service(a, b, policy=RetryPolicy(6, 30.0))
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=12, seed=3), "")
        task = asyncio.create_task(run_all(prepared))
        while not a.submitted or not a._dead:  # the job started on a (b is not ready) and a died
            await fleet.wait_changed(0.05)
        assert not task.done()
        b.set_ready(True)
        texts, _ends, _ = await task
        assert texts[0] == expected_text(3, 12)
        assert b.submitted[0].resume == tuple(model_token(3, PROMPT, i) for i in range(5))
        await fleet.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("refusal", [Overloaded("queue full", retry_after_s=2.0), Unavailable("draining")])
def test_refusals_before_the_first_token_are_retried_elsewhere(refusal: Exception) -> None:
    async def scenario() -> None:
        # Both boards refuse their first Submit; the choice lands on whichever accepts next, at
        # most one Submit per board, and with the exact tokens.
        a = FakeDaemon("a", refuse=[refusal])
        b = FakeDaemon("b")
        fleet, service = await start_service(a, b)
        for seed in range(4):  # the router's random pick sends some of these to a first
            texts, _, _ = await run_all(
                await service.prepare_completion(completion(PROMPT, max_tokens=4, seed=seed), "")
            )
            assert texts[0] == expected_text(seed, 4)
        assert len(a.submitted) + len(b.submitted) == 4 and a.refuse == []
        await fleet.close()

    asyncio.run(scenario())


def test_every_board_overloaded_is_overloaded_with_its_hint() -> None:
    async def scenario() -> None:
        a = FakeDaemon("a", refuse=[Overloaded("full", retry_after_s=4.0)] * 3)
        b = FakeDaemon("b", refuse=[Overloaded("full", retry_after_s=4.0)] * 3)
        fleet, service = await start_service(a, b)
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=4), "")
        with pytest.raises(Overloaded) as info:
            await run_all(prepared)
        assert info.value.retry_after_s == 4.0
        await fleet.close()

    asyncio.run(scenario())


def test_errors_no_board_can_fix_are_not_retried() -> None:
    async def scenario() -> None:
        a = FakeDaemon("a", refuse=[InvalidArgument("token id too large")])
        fleet, service = await start_service(a, FakeDaemon("b", refuse=[InvalidArgument("same")]))
        with pytest.raises(InvalidArgument):
            await run_all(await service.prepare_completion(completion(PROMPT, max_tokens=4), ""))
        await fleet.close()

    asyncio.run(scenario())


def test_failover_only_to_boards_with_the_same_package() -> None:
    async def scenario() -> None:
        a = FakeDaemon("a", die_after=3, package_hash="pkg-a")
        b = FakeDaemon("b", ready=False, package_hash="pkg-b")
        fleet, service = await start_service(a, b, policy=RetryPolicy(6, 0.3))
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=10, seed=2), "")
        b.set_ready(True)
        with pytest.raises(Unavailable, match="after 3 tokens"):
            await run_all(prepared)
        assert b.submitted == []  # a different tokenizer must never continue the text
        await fleet.close()

    asyncio.run(scenario())


def test_retry_looks_past_a_board_with_another_package() -> None:
    async def scenario() -> None:
        # a refuses before the first token; b (another package, and the less loaded, so the router
        # offers it first) must be skipped for c, which serves the same package: not a 503.
        a = FakeDaemon("a", refuse=[Unavailable("draining")], package_hash="pkg-a")
        b = FakeDaemon("b", ready=False, package_hash="pkg-b")
        c = FakeDaemon("c", ready=False, package_hash="pkg-a", queue_depth=8)
        fleet, service = await start_service(a, b, c)
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=10, seed=2), "")
        b.set_ready(True)
        c.set_ready(True)
        await until(fleet, lambda: len(fleet.serving("fake")) == 3, "b and c ready")
        texts, _, _ = await run_all(prepared)
        assert texts[0] == expected_text(2, 10)
        assert b.submitted == [] and len(c.submitted) == 1
        await fleet.close()

    asyncio.run(scenario())


def test_stop_string_cuts_the_text_and_cancels_the_job() -> None:
    async def scenario() -> None:
        a = FakeDaemon("a")
        fleet, service = await start_service(a)
        full = expected_text(5, 40)
        stop = full[10:13]
        cut = min(full.find(stop), 10)
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=40, seed=5, stop=[stop]), "")
        texts, ends, _ = await run_all(prepared)
        assert texts.get(0, "") == full[:cut]
        assert ends[0].finish_reason == "stop"
        assert ends[0].completion_tokens < 40
        assert a.submitted[0].cancelled
        await fleet.close()

    asyncio.run(scenario())


def test_eos_ends_with_stop_and_is_not_rendered() -> None:
    async def scenario() -> None:
        a = FakeDaemon("a", eos_at=6)
        fleet, service = await start_service(a)
        texts, ends, _ = await run_all(await service.prepare_chat(chat("hello", seed=9, max_tokens=50), ""))
        prompt = a.submitted[0].job.prompt_tokens
        assert texts[0] == expected_text(9, 6, list(prompt))
        assert ends[0].finish_reason == "stop" and ends[0].completion_tokens == 7
        assert "<|im_end|>" not in texts[0]
        await fleet.close()

    asyncio.run(scenario())


def test_reader_leaving_early_cancels_the_daemon_job() -> None:
    async def scenario() -> None:
        a = FakeDaemon("a", step=asyncio.Semaphore(3))
        fleet, service = await start_service(a)
        prepared = await service.prepare_completion(completion(PROMPT, max_tokens=100, seed=1), "")
        events = prepared.events()
        await anext(events)
        await events.aclose()  # the HTTP client went away
        await asyncio.sleep(0)  # the cancel runs as its own task
        assert a.submitted[0].cancelled
        await fleet.close()

    asyncio.run(scenario())


def test_n_choices_use_consecutive_seeds() -> None:
    async def scenario() -> None:
        fleet, service = await start_service(FakeDaemon("a"), FakeDaemon("b"))
        texts, ends, _ = await run_all(
            await service.prepare_completion(completion(PROMPT, max_tokens=8, n=3, seed=40), "")
        )
        assert [texts[i] for i in range(3)] == [expected_text(40 + i, 8) for i in range(3)]
        assert sorted(ends) == [0, 1, 2]
        await fleet.close()

    asyncio.run(scenario())


def test_request_checks_before_any_submit() -> None:
    async def scenario() -> None:
        a = FakeDaemon("a")
        fleet, service = await start_service(a)
        with pytest.raises(ModelNotFound):
            await service.prepare_completion(completion(PROMPT).model_copy(update={"model": "nope"}), "")
        with pytest.raises(InvalidArgument, match="context"):
            await service.prepare_completion(completion([65] * CONTEXT), "")
        with pytest.raises(InvalidArgument, match="max_tokens"):
            await service.prepare_completion(completion([65] * 10, max_tokens=CONTEXT), "")
        with pytest.raises(InvalidArgument, match="outside the vocabulary"):
            await service.prepare_completion(completion([65, 100000]), "")
        a.set_ready(False)
        await fleet.wait_changed(1.0)
        with pytest.raises(Unavailable) as info:
            await service.prepare_completion(completion(PROMPT), "")
        assert info.value.kind is ErrorKind.UNAVAILABLE
        a.kill()  # with no board reachable an unknown model is not known to be unknown: 503, not 404
        await until(fleet, lambda: not fleet.any_up(), "board down")
        with pytest.raises(Unavailable, match="no board"):
            await service.prepare_completion(completion(PROMPT).model_copy(update={"model": "nope"}), "")
        assert a.submitted == []
        await fleet.close()

    asyncio.run(scenario())
