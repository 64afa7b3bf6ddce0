"""Jump-forward through the real engine on calsim's tiny package (docs/daemon.md "Constrained
decoding", `daemon/core/jump.py`): a package declaring `prefill_at_offset` appends a constraint's
forced runs without decoding them, and its tokens, logprobs and finish reasons equal those of the
same package without the declaration (which decodes every token) for many seeds, sampling kinds
and constraints, a named-tool-style Lark grammar among them; the undeclared package never jumps;
max_tokens inside a forced run ends it LENGTH on the step path's token; a fault on a jump's prefill
re-prefills the sequence as for a chunk, with the undisturbed tokens, and a cancel while it runs
ends the job CANCELLED after the streamed run, freeing everything; a request resumed inside or after
a run continues with the undisturbed tokens."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.daemon.calsim.device import CalsimDevice
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.calsim.handles import CalsimSubmission
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinalEvent, FinishReason, TokenLogprob
from calculet.daemon.core.request import GenerationRequest
from calculet.daemon.device.api import ConfiguredModel
from calculet.daemon.device.types import EngineSlot, JobSpec
from calculet.daemon.sampling.constraint import Constraint, ConstraintKind
from calculet.ops.sim_packages.build import build_sim_package
from tests.unit.server.held_device import HeldSubmitDevice

from .engine_factories import assert_clean, finished_events, request, running_core

JUMPS, STEPS = "tiny", "tinysteps"
PROMPT = (5, 17, 200, 33, 9, 401, 77)
SCHEMA = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "maxLength": 6},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["location", "unit", "days"],
    "additionalProperties": False,
}
# What a `required` call of the one tool `get_weather` constrains (the gateway's tool grammar shape):
# the wrapper and the name are forced, only the argument's value is drawn.
TOOL = (
    'start: "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" '
    '/[a-z]{1,8}/ "\\"}}\\n</tool_call>"'
)
CONSTRAINTS = {
    "schema": Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)),
    "tool": Constraint(ConstraintKind.LARK, TOOL),
    "choice": Constraint(ConstraintKind.CHOICE, choices=("partly cloudy today", "rain")),
}
KINDS: dict[str, dict[str, object]] = {
    "greedy": {"temperature": 0.0},
    "temperature": {"temperature": 1.0},
    "logprobs": {"temperature": 0.8, "logprobs": 3},
    "penalties": {"temperature": 0.8, "repetition_penalty": 1.3, "logprobs": 0},
}
SEEDS = range(10)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jump")
    build_sim_package("tiny", root / JUMPS)  # declares prefill_at_offset: true
    build_sim_package("tiny", root / STEPS, prefill_at_offset=None)  # the same weights, undeclared
    return root


@pytest.fixture
def jumps(models: Path) -> Iterator[DeviceCore]:
    with running_core(models, model=JUMPS, fault_injection=True) as core:
        yield core


@pytest.fixture
def steps(models: Path) -> Iterator[DeviceCore]:
    with running_core(models, model=STEPS) as core:
        yield core


def constrained(c: Constraint, seed: int, model: str, max_tokens: int = 80, **kw: object) -> GenerationRequest:
    req = request(PROMPT, max_tokens, seed=seed, model=model, ignore_eos=False, **kw)
    return dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, constraint=c))


def run(core: DeviceCore, req: GenerationRequest) -> tuple[list[int], list[TokenLogprob], FinalEvent]:
    events = finished_events(core, core.submit(req).job_id)
    tokens = [t for e in events[:-1] for t in getattr(e, "tokens", ())]
    logprobs = [lp for e in events[:-1] for lp in getattr(e, "logprobs", ())]
    return tokens, logprobs, events[-1]


def both(jumps: DeviceCore, steps: DeviceCore, make: object, **kw: object) -> None:
    """The request on both packages: equal tokens, logprobs, finish reason and usage."""
    assert callable(make)
    a_tokens, a_lp, a_final = run(jumps, make(JUMPS, **kw))
    b_tokens, b_lp, b_final = run(steps, make(STEPS, **kw))
    assert a_tokens == b_tokens, kw
    assert a_lp == b_lp, kw
    assert (a_final.reason, a_final.usage) == (b_final.reason, b_final.usage), kw


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", CONSTRAINTS)
def test_jumps_give_the_step_paths_tokens_and_logprobs(
    jumps: DeviceCore, steps: DeviceCore, name: str, kind: str
) -> None:
    c = CONSTRAINTS[name]
    for seed in SEEDS:
        both(jumps, steps, lambda model, seed=seed: constrained(c, seed, model, **KINDS[kind]))
    rt_jumps, rt_steps = jumps.models.published(JUMPS), steps.models.published(STEPS)
    assert rt_jumps is not None and rt_steps is not None
    assert rt_jumps.jump_min_run == 1 and rt_jumps.jumps.runs > 0 and rt_jumps.jumps.tokens > rt_jumps.jumps.runs
    assert rt_steps.jump_min_run == 0 and rt_steps.jumps.runs == 0  # undeclared: step by step
    assert_clean(jumps)
    assert_clean(steps)


def test_max_tokens_inside_a_forced_run_ends_length(jumps: DeviceCore, steps: DeviceCore) -> None:
    """The tool wrapper is one long forced run after the first token: every max_tokens inside it
    ends LENGTH on the step path's last token, with no prefill of the cut run."""
    c = CONSTRAINTS["tool"]
    for max_tokens in range(1, 16):
        both(jumps, steps, lambda model, n=max_tokens: constrained(c, 3, model, max_tokens=n, logprobs=1))
        tokens, _, final = run(jumps, constrained(c, 3, JUMPS, max_tokens=max_tokens))
        assert final.reason is FinishReason.LENGTH and len(tokens) == max_tokens
    rt = jumps.models.published(JUMPS)
    assert rt is not None and rt.jumps.ended > 0
    assert_clean(jumps)


def test_a_request_resumed_inside_or_after_a_run_continues_undisturbed(jumps: DeviceCore) -> None:
    c = CONSTRAINTS["schema"]
    full, _, final = run(jumps, constrained(c, 7, JUMPS, temperature=1.0))
    assert final.reason is FinishReason.STOP
    for k in range(1, len(full)):
        resumed = dataclasses.replace(constrained(c, 7, JUMPS, temperature=1.0), resume_tokens=tuple(full[:k]))
        rest, _, again = run(jumps, resumed)
        assert full[:k] + rest == full and again.reason is FinishReason.STOP, k
    assert_clean(jumps)


@pytest.mark.parametrize("kind", [FaultKind.CCU_EXCEPTION, FaultKind.NAN_LOGITS, FaultKind.SUBMIT_ERROR])
def test_a_fault_on_a_jumps_prefill_recovers_with_the_undisturbed_tokens(jumps: DeviceCore, kind: FaultKind) -> None:
    """The tool call's second job is the prefill of its first token's forced run (the wrapper)."""
    req = constrained(CONSTRAINTS["tool"], 5, JUMPS, temperature=1.0)
    tokens, _, final = run(jumps, req)
    rt = jumps.models.published(JUMPS)
    assert rt is not None and rt.jumps.runs > 0
    recoveries = jumps.status().recoveries
    jumps.inject_fault(Fault(kind, job=jumps.next_job_index() + 1))
    again, _, again_final = run(jumps, req)
    assert again == tokens and again_final.reason is final.reason is FinishReason.STOP
    assert jumps.status().recoveries > recoveries
    assert_clean(jumps)


class HeldSecondSubmit(HeldSubmitDevice):
    """calsim whose second submit after `hold()` blocks until `let_go()` (the first passes)."""

    def __init__(self) -> None:
        super().__init__()
        self.passes = 0

    def hold(self) -> None:
        self.passes = 1
        super().hold()

    def submit(
        self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO
    ) -> CalsimSubmission:
        if self.passes:
            self.passes -= 1
            return CalsimDevice.submit(self, model, job, engine_slot)
        return super().submit(model, job, engine_slot)


def test_a_cancel_during_a_jumps_prefill_ends_cancelled_after_the_streamed_run(jumps: DeviceCore, models: Path) -> None:
    req = constrained(CONSTRAINTS["tool"], 5, JUMPS, temperature=1.0)
    undisturbed, _, _ = run(jumps, req)
    device = HeldSecondSubmit()
    core = DeviceCore(DaemonConfig(models_root=models, models=((JUMPS, JUMPS),)), device=device)
    core.start()
    try:
        device.hold()  # the request's prefill passes; the prefill of its first token's run is held
        job = core.submit(req).job_id
        assert device.entered.wait(60), "the jump's prefill was never submitted"
        assert core.cancel(job)
        device.let_go()
        events = finished_events(core, job)
        tokens = [t for e in events[:-1] for t in getattr(e, "tokens", ())]
        assert events[-1].reason is FinishReason.CANCELLED
        assert len(tokens) > 10 and tokens == undisturbed[: len(tokens)]  # the drawn token and its run
        assert_clean(core)
    finally:
        core.close()
