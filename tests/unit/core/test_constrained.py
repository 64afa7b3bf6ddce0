"""Constrained requests through the real engine on calsim's tiny package (docs/daemon.md "Constrained
decoding"): the output of a JSON-schema request parses and validates, for many seeds; a grammar that
completes ends the job STOP, max_tokens first ends it LENGTH; a full and a top-k package give equal
tokens for every kind of request; a request resumed after k tokens continues with the undisturbed
run's tokens (its matcher replays them); a refused constraint is INVALID_ARGUMENT naming its field,
leaves nothing behind, and a resume the grammar refuses is refused too; the NaN recovery of a
constrained step keeps its tokens; idempotency keys, cancellation and prefix reuse behave as for any
request."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from calculet.common.errors import ErrorKind, FailedPrecondition, InvalidArgument
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.request import GenerationRequest
from calculet.daemon.device.api import ConfiguredModel
from calculet.daemon.device.types import EngineSlot, JobSpec
from calculet.daemon.grammar import GrammarMatcher
from calculet.daemon.grammar.matcher import MatcherState
from calculet.daemon.sampling.constraint import Constraint, ConstraintKind
from tests.unit.core.tiny_pair import build_tiny_pair, tiny_decoder
from tests.unit.server.held_device import HeldSubmitDevice

from .engine_factories import assert_clean, finish, request, running_core

K = 32
PROMPT = (5, 17, 200, 33, 9, 401, 77)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 5},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "n", "ok"],
    "additionalProperties": False,
}
JSON_SCHEMA = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))
REGEX = Constraint(ConstraintKind.REGEX, r"[a-f]{3,8}")
CHOICE = Constraint(ConstraintKind.CHOICE, choices=("alpha", "beta", "gamma delta"))
LARK = Constraint(ConstraintKind.LARK, 'start: "[" item ("," item)~0..3 "]"\nitem: /[0-9]{1,2}/')

KINDS: dict[str, dict[str, object]] = {
    "greedy": {"temperature": 0.0},
    "temperature": {"temperature": 1.0},
    "top-k": {"temperature": 0.9, "top_k": 8},
    "top-p": {"temperature": 1.0, "top_p": 0.9},
    "min-p": {"temperature": 1.0, "min_p": 0.1},
    "logprobs": {"temperature": 0.8, "logprobs": 3},
    "penalties": {"temperature": 0.8, "repetition_penalty": 1.3},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_pair(tmp_path_factory.mktemp("constrained"), K)


@pytest.fixture
def full(models: Path) -> Iterator[DeviceCore]:
    with running_core(models, model="tiny", fault_injection=True) as core:
        yield core


@pytest.fixture
def topk(models: Path) -> Iterator[DeviceCore]:
    with running_core(models, model="tinytopk") as core:
        yield core


@pytest.fixture(scope="module")
def decode(models: Path):  # type: ignore[no-untyped-def]
    return tiny_decoder(models)


def constrained(
    c: Constraint, seed: int, max_tokens: int = 120, model: str = "tiny", **kw: object
) -> GenerationRequest:
    req = request(PROMPT, max_tokens, seed=seed, model=model, ignore_eos=False, **kw)
    return dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, constraint=c))


def test_json_schema_outputs_validate_and_end_stop(full: DeviceCore, decode) -> None:  # type: ignore[no-untyped-def]
    ids = [full.submit(constrained(JSON_SCHEMA, seed)).job_id for seed in range(24)]
    for job_id in ids:
        tokens, final = finish(full, job_id)
        assert final.reason is FinishReason.STOP, (final, decode(tokens))
        jsonschema.validate(json.loads(decode(tokens)), SCHEMA)
    rt = full.models.published("tiny")
    assert rt is not None and rt.grammar.compiles == 1  # 24 requests, one schema: compiled once
    assert_clean(full)


def test_regex_choice_and_lark_outputs_match(full: DeviceCore, decode) -> None:  # type: ignore[no-untyped-def]
    checks = [
        (REGEX, lambda s: re.fullmatch(r"[a-f]{3,8}", s)),
        (CHOICE, lambda s: s in CHOICE.choices),
        (LARK, lambda s: re.fullmatch(r"\[[0-9]{1,2}(,[0-9]{1,2}){0,3}\]", s)),
    ]
    for c, ok in checks:
        for seed in range(8):
            tokens, final = finish(full, full.submit(constrained(c, seed, temperature=1.0)).job_id)
            assert final.reason is FinishReason.STOP and ok(decode(tokens)), (c.kind, decode(tokens))
    assert_clean(full)


def test_max_tokens_first_ends_length(full: DeviceCore, decode) -> None:  # type: ignore[no-untyped-def]
    tokens, final = finish(full, full.submit(constrained(JSON_SCHEMA, 3, max_tokens=4)).job_id)
    assert final.reason is FinishReason.LENGTH and len(tokens) == 4
    assert decode(tokens).startswith("{")


def test_full_and_topk_packages_give_equal_tokens(full: DeviceCore, topk: DeviceCore) -> None:
    for c in (JSON_SCHEMA, LARK):
        reqs = [(constrained(c, 40 + i, **kw), kind) for i, (kind, kw) in enumerate(KINDS.items())]
        want = [full.submit(r).job_id for r, _ in reqs]
        have = [topk.submit(dataclasses.replace(r, model="tinytopk")).job_id for r, _ in reqs]
        for (_, kind), w, h in zip(reqs, want, have, strict=True):
            tw, fw = finish(full, w)
            th, fh = finish(topk, h)
            assert (th, fh.reason) == (tw, fw.reason), (c.kind, kind)
    assert_clean(topk)


@pytest.mark.parametrize("k", [1, 4, 9])
def test_a_resumed_request_continues_with_the_undisturbed_tokens(full: DeviceCore, k: int) -> None:
    req = constrained(JSON_SCHEMA, 7, temperature=1.0)
    tokens, final = finish(full, full.submit(req).job_id)
    assert len(tokens) > k
    resumed = dataclasses.replace(req, resume_tokens=tuple(tokens[:k]))
    rest, final2 = finish(full, full.submit(resumed).job_id)
    assert tokens[:k] + rest == tokens and final2.reason is final.reason
    assert_clean(full)


def test_a_recovered_constrained_step_keeps_its_tokens(full: DeviceCore) -> None:
    req = constrained(JSON_SCHEMA, 11, temperature=1.0)
    tokens, _ = finish(full, full.submit(req).job_id)
    full.inject_fault(Fault(FaultKind.NAN_LOGITS, job=full.next_job_index() + 4))
    again, _ = finish(full, full.submit(req).job_id)
    assert again == tokens and full.status().recoveries >= 1


@pytest.mark.parametrize(
    ("c", "field"),
    [
        (Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "objx"}'), "constraint.json_schema"),
        (Constraint(ConstraintKind.REGEX, "(("), "constraint.regex"),
        (Constraint(ConstraintKind.LARK, "start: nothing_here"), "constraint.lark"),
    ],
)
def test_a_refused_constraint_is_invalid_argument_and_leaves_the_board_healthy(
    full: DeviceCore, c: Constraint, field: str
) -> None:
    with pytest.raises(InvalidArgument, match=f"^{re.escape(field)}: "):
        full.submit(constrained(c, 1))
    assert_clean(full)
    assert full.health().serving
    tokens, final = finish(full, full.submit(constrained(CHOICE, 1)).job_id)
    assert final.reason is FinishReason.STOP and tokens


def test_a_resume_the_grammar_refuses_is_invalid_argument(full: DeviceCore, decode) -> None:  # type: ignore[no-untyped-def]
    tokens, _ = finish(full, full.submit(constrained(CHOICE, 2)).job_id)
    other = next(t for t in range(3, 512) if decode([t]) and decode([t])[0] not in "abgd")
    with pytest.raises(InvalidArgument, match=r"^resume_tokens\[0\]: "):
        full.submit(dataclasses.replace(constrained(CHOICE, 2), resume_tokens=(other,)))
    with pytest.raises(InvalidArgument, match=r"^resume_tokens: "):
        full.submit(dataclasses.replace(constrained(CHOICE, 2), resume_tokens=tuple(tokens)))
    assert_clean(full)


def test_idempotency_keys_cover_the_constraint(full: DeviceCore) -> None:
    req = dataclasses.replace(constrained(CHOICE, 4), client_request_id="same-key")
    first = full.submit(req)
    again = full.submit(req)
    assert again.deduplicated and again.job_id == first.job_id
    other = dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, constraint=REGEX))
    with pytest.raises(FailedPrecondition):
        full.submit(other)
    finish(full, first.job_id)
    assert_clean(full)


def test_a_constrained_job_cancelled_in_flight_ends_cancelled_and_frees_everything(models: Path) -> None:
    device = HeldSubmitDevice()
    core = DeviceCore(DaemonConfig(models_root=models, models=(("tiny", "tiny"),)), device=device)
    core.start()
    try:
        device.hold()  # the job's prefill reaches the device and waits there
        job = core.submit(constrained(JSON_SCHEMA, 5)).job_id
        assert device.entered.wait(60), "the prefill was never submitted"
        assert core.cancel(job)
        device.let_go()
        tokens, final = finish(core, job)
        assert final.reason is FinishReason.CANCELLED and len(tokens) <= 1
        assert_clean(core)
        done = core.engine._jobs.get(job)  # white box: a finished job keeps no parser state
        assert done is not None and done.grammar is None
    finally:
        core.close()


def test_prefix_reuse_serves_a_constrained_next_turn_with_the_cold_runs_tokens(models: Path) -> None:
    def play(core: DeviceCore) -> list[tuple[list[int], int]]:
        first = constrained(JSON_SCHEMA, 8, temperature=1.0)
        tokens, one = finish(core, core.submit(first).job_id)
        turn = dataclasses.replace(first, prompt_tokens=(*PROMPT, *tokens, 1, 2, 3))
        tokens2, two = finish(core, core.submit(turn).job_id)
        return [(tokens, one.usage.cached_tokens), (tokens2, two.usage.cached_tokens)]

    with running_core(models, prefix_reuse=False) as cold:
        want = play(cold)
    with running_core(models) as warm:
        got = play(warm)
        assert_clean(warm)
    assert [t for t, _ in got] == [t for t, _ in want]
    assert got[1][1] > 0 and want[1][1] == 0  # the next turn's prefix came from the parked lane


class WaitLogDevice(HeldSubmitDevice):
    """calsim that logs "wait" each time the engine starts waiting for a device job."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def submit(self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO) -> Any:
        sub = super().submit(model, job, engine_slot)
        inner = sub.wait

        def wait(timeout: float | None = None) -> Any:
            self.log.append("wait")
            return inner(timeout)

        sub.wait = wait  # type: ignore[method-assign]
        return sub


def test_each_mask_is_computed_while_the_device_runs_the_step(models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The completion thread computes a constrained row's mask after its job is submitted and before
    it waits for it: every wait of the request's jobs follows its mask, none precedes it. One job per
    token the device produced: the forced runs jump-forward appended ran in no step of their own."""
    log: list[str] = []
    core = DeviceCore(DaemonConfig(models_root=models, models=(("tiny", "tiny"),)), device=WaitLogDevice(log))
    core.start()
    try:
        allowed = GrammarMatcher.allowed

        def logged(self: GrammarMatcher) -> Any:
            log.append("mask")
            return allowed(self)

        monkeypatch.setattr(GrammarMatcher, "allowed", logged)
        log.clear()  # the warm-up probes' jobs
        tokens, final = finish(core, core.submit(constrained(JSON_SCHEMA, 6)).job_id)
        assert final.reason is FinishReason.STOP
        rt = core.models.published("tiny")
        assert rt is not None and rt.jumps.tokens > 0  # forced runs were appended, not decoded (jump.py)
        assert log == ["mask", "wait"] * (len(tokens) - rt.jumps.tokens), log[:8]
    finally:
        core.close()


def test_a_failed_matcher_ends_its_job_with_an_error_not_an_unconstrained_token(models: Path) -> None:
    """White box: a matcher llguidance reports an error for (no token drawn from its own mask can do
    that) allows nothing; its row ends ERROR INTERNAL naming the matcher, and nothing leaks."""
    device = HeldSubmitDevice()
    core = DeviceCore(DaemonConfig(models_root=models, models=(("tiny", "tiny"),)), device=device)
    core.start()
    try:
        device.hold()
        job = core.submit(constrained(CHOICE, 5)).job_id
        assert device.entered.wait(60), "the prefill was never submitted"
        seq = core.engine._jobs.get(job)
        assert seq is not None and seq.grammar is not None
        forbidden = int(np.flatnonzero(~seq.grammar.allowed())[0])
        seq.grammar.consume(forbidden)  # the job is held in submit: nothing else reads the matcher now
        assert seq.grammar.state is MatcherState.FAILED
        device.let_go()
        tokens, final = finish(core, job)
        assert final.reason is FinishReason.ERROR and final.error_kind is ErrorKind.INTERNAL
        assert "constraint.choice matcher allows no token" in final.error_message and tokens == []
        assert_clean(core)
    finally:
        core.close()
