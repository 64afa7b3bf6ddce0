"""Thinking budgets through the real engine on calsim's tiny package (docs/daemon.md "Thinking
budget"). The tiny tokenizer has no `<think>` tokens, so ordinary ids stand for the markers: what the
daemon does depends only on the ids the request names.

The oracle of a forced close: it is a token of the request's history like any other, so the run
equals an unbudgeted run with the same seed up to it, and an unbudgeted run resumed with the tokens
up to and including the forced close continues exactly as the budgeted run did (forcing one token
leaves the draws of the others, keyed by (seed, step), unchanged). Also: a resume the budget could
not have produced is refused, idempotency keys cover the budget, and the masks of a constrained row
before and inside its think block."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from calculet.common.errors import FailedPrecondition, InvalidArgument
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core import completion
from calculet.daemon.core.client_job import ClientJob
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinishReason, TokenChunk
from calculet.daemon.core.request import GenerationRequest
from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.sampling.constraint import Constraint, ConstraintKind
from calculet.daemon.sampling.thinking import ThinkingBudget, ThinkingTracker
from calculet.ops.sim_packages.build import build_sim_package
from tests.unit.core.tiny_pair import build_tiny_pair, tiny_decoder

from .engine_factories import assert_clean, finish, finished_events, request, running_core

K = 32
OPEN, CLOSE = 300, 301  # stand-ins for <think> / </think> (plain ids of the tiny vocabulary)
PROMPT = (5, 17, 200, 33, 9, 401, 77)
THINKING_PROMPT = (*PROMPT, OPEN)  # a generation prompt that opened the block
CHOICE = Constraint(ConstraintKind.CHOICE, choices=("alpha", "beta", "gamma delta"))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_pair(tmp_path_factory.mktemp("thinking"), K)


@pytest.fixture
def core(models: Path) -> Iterator[DeviceCore]:
    with running_core(models, model="tiny", fault_injection=True) as c:
        yield c


@pytest.fixture
def topk(models: Path) -> Iterator[DeviceCore]:
    with running_core(models, model="tinytopk") as c:
        yield c


@pytest.fixture(scope="module")
def decode(models: Path):  # type: ignore[no-untyped-def]
    return tiny_decoder(models)


def req(
    budget: int | None,
    seed: int = 3,
    *,
    prompt: tuple[int, ...] = THINKING_PROMPT,
    max_tokens: int = 24,
    open_token: int = OPEN,
    close_token: int = CLOSE,
    **kw: object,
) -> GenerationRequest:
    r = request(prompt, max_tokens, seed=seed, temperature=kw.pop("temperature", 1.0), **kw)
    thinking = ThinkingBudget(budget, open_token, close_token) if budget is not None else None
    return dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, thinking=thinking))


def run(core: DeviceCore, r: GenerationRequest) -> list[int]:
    tokens, final = finish(core, core.submit(r).job_id)
    assert final.reason in (FinishReason.LENGTH, FinishReason.STOP), final
    return tokens


@pytest.mark.parametrize("n", [0, 1, 5, 12])
def test_the_close_is_forced_after_n_thinking_tokens(core: DeviceCore, n: int) -> None:
    free = run(core, req(None))
    assert CLOSE not in free  # the model never closes by itself here: only the budget does
    tokens = run(core, req(n))
    assert len(tokens) == 24  # the forced token counts toward max_tokens
    assert tokens[:n] == free[:n] and tokens[n] == CLOSE and tokens.count(CLOSE) == 1
    # The oracle: the forced close resumed as an ordinary token gives the same continuation.
    resumed = run(core, dataclasses.replace(req(None), resume_tokens=tuple(tokens[: n + 1])))
    assert tokens[: n + 1] + resumed == tokens
    assert tokens[n + 1 :] != free[n + 1 :]  # the close changed the context: the answer differs
    assert_clean(core)


def test_a_close_the_model_draws_itself_is_not_forced_again(core: DeviceCore) -> None:
    free = run(core, req(None))
    p = next(i for i in range(2, len(free)) if free[i] not in free[:i] and free[i] != OPEN)
    close = free[p]  # the model "closes" at p by itself
    tokens = run(core, req(p + 3, close_token=close))
    assert tokens == free  # no token forced: not at p + 3, not later
    assert_clean(core)


def test_a_block_the_first_token_opens_is_budgeted_and_none_otherwise(core: DeviceCore) -> None:
    free = run(core, req(None, prompt=PROMPT))
    opened = free[0]  # the model "opens" the block with its first token
    tokens = run(core, req(4, prompt=PROMPT, open_token=opened, close_token=CLOSE))
    assert tokens[:5] == free[:5] and tokens[5] == CLOSE
    # The open token anywhere but first opens nothing: no block, nothing forced.
    later = free[6]
    assert later not in free[:6] and later not in PROMPT
    assert run(core, req(0, prompt=PROMPT, open_token=later, close_token=CLOSE)) == free
    # A prompt whose last marker is a close has no open block either.
    closed = (*THINKING_PROMPT, 11, CLOSE, 12)
    assert run(core, req(0, prompt=closed)) == run(core, req(None, prompt=closed))
    assert_clean(core)


@pytest.mark.parametrize("n", [0, 3])
def test_a_resume_at_every_point_equals_the_undisturbed_run(core: DeviceCore, n: int) -> None:
    r = req(n, seed=9, max_tokens=12)
    tokens = run(core, r)
    assert tokens[n] == CLOSE
    for k in range(1, len(tokens)):  # before, at and after the forced token
        rest = run(core, dataclasses.replace(r, resume_tokens=tuple(tokens[:k])))
        assert tokens[:k] + rest == tokens, k
    assert_clean(core)


def test_a_forced_token_reports_logprob_zero_without_alternatives(core: DeviceCore) -> None:
    events = finished_events(core, core.submit(req(2, logprobs=3)).job_id)
    lps = [lp for e in events if isinstance(e, TokenChunk) for lp in e.logprobs]
    assert len(lps) == 24 and lps[2].token == CLOSE and (lps[2].logprob, lps[2].top) == (0.0, ())
    assert all(lp.logprob < 0.0 and len(lp.top) == 3 for i, lp in enumerate(lps) if i != 2)


@pytest.mark.parametrize("offset", [2, 3, 4, 5])
def test_a_recovered_step_near_the_forced_one_keeps_its_tokens(core: DeviceCore, offset: int) -> None:
    r = req(3, seed=5)
    tokens = run(core, r)
    before = core.status().recoveries
    # Device job k of the run produces token k (one prefill job, then one decode job per token):
    # NaN logits before, at and after the forced token 3; the step re-prefills and goes on.
    core.inject_fault(Fault(FaultKind.NAN_LOGITS, job=core.next_job_index() + offset))
    assert run(core, r) == tokens and core.status().recoveries == before + 1
    assert_clean(core)


def test_full_and_topk_packages_give_equal_tokens(core: DeviceCore, topk: DeviceCore) -> None:
    for n, kw in ((0, {}), (4, {"top_k": 8}), (7, {"top_p": 0.9, "logprobs": 2})):
        r = req(n, seed=20 + n, **kw)
        assert run(topk, dataclasses.replace(r, model="tinytopk")) == run(core, r)
    assert_clean(topk)


def test_a_constraint_applies_after_the_close_only(core: DeviceCore, decode) -> None:  # type: ignore[no-untyped-def]
    for n in (0, 2, 6):
        for seed in range(4):
            r = req(n, seed=seed, max_tokens=40, ignore_eos=False)
            r = dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, constraint=CHOICE))
            tokens, final = finish(core, core.submit(r).job_id)
            free = run(core, req(n, seed=seed, max_tokens=n + 1))
            assert tokens[: n + 1] == free  # the thinking is free text, not masked
            assert final.reason is FinishReason.STOP and decode(tokens[n + 1 :]) in CHOICE.choices, decode(tokens)
            for k in (n, n + 1, n + 2):  # resumed before, at and after the close
                rest, again = finish(core, core.submit(dataclasses.replace(r, resume_tokens=tuple(tokens[:k]))).job_id)
                assert tokens[:k] + rest == tokens and again.reason is FinishReason.STOP
    assert_clean(core)


def test_a_constrained_request_may_open_its_block_first_or_answer_at_once(core: DeviceCore, decode) -> None:  # type: ignore[no-untyped-def]
    r = req(3, prompt=PROMPT, max_tokens=40, ignore_eos=False, temperature=0.0)
    r = dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, constraint=CHOICE))
    answer, final = finish(core, core.submit(r).job_id)  # greedy: answers at once, masked from token 0
    assert final.reason is FinishReason.STOP and decode(answer) in CHOICE.choices
    # With the open token the greedy first draw of the masked row, it opens a block instead.
    opened = dataclasses.replace(
        r, sampling=dataclasses.replace(r.sampling, thinking=ThinkingBudget(3, answer[0], CLOSE))
    )
    tokens, final = finish(core, core.submit(opened).job_id)
    assert tokens[0] == answer[0] and tokens[4] == CLOSE
    assert final.reason is FinishReason.STOP and decode(tokens[5:]) in CHOICE.choices
    assert_clean(core)


@pytest.mark.parametrize(
    ("thinking", "field"),
    [
        (lambda: ThinkingBudget(-1, OPEN, CLOSE), "thinking.budget"),
        (lambda: ThinkingBudget(True, OPEN, CLOSE), "thinking.budget"),  # type: ignore[arg-type]
        (lambda: ThinkingBudget(4, OPEN, OPEN), "thinking.close_token_id"),
        (lambda: ThinkingBudget(4, 10**6, CLOSE), "thinking.open_token_id"),
        (lambda: ThinkingBudget(4, OPEN, 10**6), "thinking.close_token_id"),
    ],
)
def test_a_bad_budget_is_invalid_argument_naming_its_field(core: DeviceCore, thinking, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match=f"^{re.escape(field)}: "):
        r = req(None)
        core.submit(dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, thinking=thinking())))
    assert_clean(core)
    assert core.health().serving
    assert run(core, req(1))[1] == CLOSE


def test_a_marker_that_is_a_stop_token_is_refused(core: DeviceCore) -> None:
    eos = sorted(core.models.published("tiny").eos_ids)[0]  # type: ignore[union-attr]
    with pytest.raises(InvalidArgument, match=r"^thinking\.close_token_id: .* stop token"):
        core.submit(req(2, close_token=eos, ignore_eos=False))
    with pytest.raises(InvalidArgument, match=r"^thinking\.open_token_id: .* stop token"):
        core.submit(dataclasses.replace(req(2), stopping=dataclasses.replace(req(2).stopping, stop_token_ids=(OPEN,))))
    assert_clean(core)


def test_a_resume_the_budget_could_not_have_produced_is_refused(core: DeviceCore) -> None:
    free = run(core, req(None, max_tokens=8))
    with pytest.raises(InvalidArgument, match=r"^resume_tokens\[2\]: the thinking budget forces"):
        core.submit(dataclasses.replace(req(2, max_tokens=8), resume_tokens=tuple(free[:4])))
    assert_clean(core)


def test_idempotency_keys_cover_the_budget(core: DeviceCore) -> None:
    r = dataclasses.replace(req(2), client_request_id="same-key")
    first = core.submit(r)
    assert core.submit(r).job_id == first.job_id
    other = dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, thinking=ThinkingBudget(3, OPEN, CLOSE)))
    with pytest.raises(FailedPrecondition):
        core.submit(other)
    finish(core, first.job_id)


def test_a_pending_constrained_row_may_draw_the_open_token_and_a_thinking_row_is_unmasked(core: DeviceCore) -> None:
    rt = core.models.published("tiny")
    assert rt is not None
    grammar_only = rt.grammar.matcher(CHOICE).allowed()
    assert not grammar_only[OPEN]  # the choice grammar alone forbids it

    def seq(prompt: tuple[int, ...]) -> ClientJob:
        r = req(2, prompt=prompt)
        s = ClientJob(
            "job-m", dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, constraint=CHOICE)), 1, frozenset()
        )
        s.grammar = rt.grammar.matcher(CHOICE)
        s.thinking = ThinkingTracker(s.request.sampling.thinking, prompt, s.job_id)  # type: ignore[arg-type]
        return s

    pending, thinking = seq(PROMPT), seq(THINKING_PROMPT)
    masks = completion.row_masks([pending, thinking])
    allowed = masks.allowed[0]
    assert allowed is not None and allowed[OPEN] and (allowed ^ grammar_only).sum() == 1
    assert masks.allowed[1] is None and masks.failed == (None, None)


def test_a_qwen_package_budgets_with_the_markers_of_its_own_tokenizer(tmp_path: Path) -> None:
    build_sim_package("qwen3-30b-a3b", tmp_path / "qwen", decode_batches=(1, 4), lanes=4, lane_context=2048)
    tok = Tokenizer.from_file(str(tmp_path / "qwen" / load_manifest(tmp_path / "qwen").tokenizer.path))
    open_id, close_id = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    assert open_id is not None and close_id is not None  # looked up by text, as the gateway does
    prompt = tuple(tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n").ids)
    with running_core(tmp_path, model="qwen") as qwen:
        r = req(6, prompt=prompt, model="qwen", open_token=open_id, close_token=close_id)
        tokens = run(qwen, r)
        assert tokens[6] == close_id and close_id not in tokens[:6]
        assert "</think>" in tok.decode(tokens, skip_special_tokens=False)
        assert_clean(qwen)


def test_a_constrained_answer_is_never_cut_off_inside_its_thinking(core: DeviceCore, decode) -> None:  # type: ignore[no-untyped-def]
    """With a constraint a job may end only by completing it (or by max_tokens): inside the think block
    a stop token may not be drawn, or the answer the constraint promises would never come."""
    n = 40
    closed_early = 0
    for seed in range(30):
        r = req(n, seed=seed, max_tokens=n + 30, ignore_eos=False)
        r = dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, constraint=CHOICE))
        tokens, final = finish(core, core.submit(r).job_id)
        close = tokens.index(CLOSE) if CLOSE in tokens else -1
        assert close >= 0 and final.reason is FinishReason.STOP, (seed, final.reason, tokens)
        assert decode(tokens[close + 1 :]) in CHOICE.choices, (seed, decode(tokens))
        closed_early += close < n  # a stop drawn inside the block became its close
        for k in (close, close + 1):  # resumed before and after that close: the undisturbed tokens
            rest, again = finish(core, core.submit(dataclasses.replace(r, resume_tokens=tuple(tokens[:k]))).job_id)
            assert tokens[:k] + rest == tokens and again.reason is FinishReason.STOP
    assert closed_early  # the case this test is about happened (seed 3 draws a stop inside its block)
    assert_clean(core)
