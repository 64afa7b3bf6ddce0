"""Prefix reuse and chunked prefill through the real engine on the `tiny` package (numeric kernel):
a conversation's next turn prefills only its new tokens and gets exactly a cold run's tokens and
logprobs; a long prompt in chunks equals it in one job; every reset or fault between turns drops the
parked KV, so the next turn runs cold (and calsim's KV checks prove no stale KV was read)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from calculet.common.prefix import block_hashes
from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core.chunking import CHUNK_OFF
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinalEvent, FinishReason
from calculet.daemon.core.kv import KVManager, LaneState
from calculet.daemon.core.request import GenerationRequest
from calculet.daemon.device.api import ConfiguredModel
from calculet.daemon.device.types import EngineSlot, JobSpec
from calculet.ops.sim_packages.build import build_sim_package
from tests.unit.server.held_device import HeldSubmitDevice

from .engine_factories import assert_clean, finish, request, running_core, until

Step = tuple[int, float, tuple[tuple[int, float], ...]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prefix-reuse")
    build_sim_package("tiny", root / "tiny")
    return root


def turn_request(prompt: list[int], seed: int, answer: int = 20) -> GenerationRequest:
    return request(tuple(prompt), answer, seed=seed, temperature=0.9, top_p=0.95, logprobs=3)


def run(core: DeviceCore, req: GenerationRequest) -> tuple[list[Step], FinalEvent]:
    job = core.submit(req).job_id
    tokens, final = finish(core, job)
    events = core.event_log(job).read(0)
    steps = [(lp.token, lp.logprob, lp.top) for e in events[:-1] for lp in getattr(e, "logprobs", ())]
    assert [s[0] for s in steps] == tokens and final.reason is FinishReason.LENGTH, final
    return steps, final


def conversation(core: DeviceCore, turns: int = 5) -> list[tuple[list[int], list[Step], FinalEvent]]:
    """A chat of `turns` turns: each prompt is the previous prompt, its answer and 10 new tokens."""
    prompt = [(7 * i + 3) % 500 for i in range(30)]
    out = []
    for turn in range(turns):
        steps, final = run(core, turn_request(prompt, seed=100 + turn))
        out.append((list(prompt), steps, final))
        prompt = [*prompt, *(s[0] for s in steps), *((11 * turn + j) % 500 for j in range(10))]
    return out


# With fixed slots (`lane_selection=false`) a parked lane is its slot: reuse works the same.
@pytest.mark.parametrize("fixed_slots", [False, True])
def test_a_conversation_reuses_its_lane_and_gets_exactly_the_cold_tokens(models: Path, fixed_slots: bool) -> None:
    with running_core(models, prefix_reuse=False) as cold:
        want = conversation(cold)
        assert all(final.usage.cached_tokens == 0 for _, _, final in want)
    options = {"lane_selection": False} if fixed_slots else {}
    with running_core(models, device_options=options) as warm:
        got = conversation(warm)
        status = warm.status()
        assert_clean(warm)
    for turn, ((_prompt, steps, final), (_, cold_steps, _)) in enumerate(zip(got, want, strict=True)):
        assert steps == cold_steps, f"turn {turn}: tokens or logprobs differ from the cold run"
        if turn:
            previous_prompt, previous_steps, _ = got[turn - 1]
            # The lane held the previous prompt and its answer but the last answer token (never fed).
            assert final.usage.cached_tokens == len(previous_prompt) + len(previous_steps) - 1
    assert got[0][2].usage.cached_tokens == 0
    prefix = status.models[0].prefix_cache
    assert prefix is not None and prefix.hits == 4 and prefix.misses == 1
    assert prefix.hit_tokens == sum(final.usage.cached_tokens for _, _, final in got)
    assert prefix.hit_tokens + prefix.miss_tokens == sum(len(p) for p, _, _ in got)


def test_a_stranger_with_the_same_system_prompt_leaves_a_short_conversation_its_lane(models: Path) -> None:
    """Issue 30, defect 6, through the engine: a conversation holds 101 tokens, 61 of them its own past
    a 40-token system prompt; a stranger with the same system prompt comes while 3 of the 4 lanes are
    FREE. It takes one of them cold, and the conversation's next turn reuses all 101 tokens (not the
    40 of the system prompt). Every answer is a cold run's."""
    system = [(7 * i + 3) % 500 for i in range(40)]
    first = [*system, *((13 * i + 5) % 500 for i in range(10))]
    stranger = [*system, *((17 * i + 2) % 500 for i in range(10))]

    def play(core: DeviceCore) -> list[tuple[list[Step], FinalEvent]]:
        one = run(core, turn_request(first, seed=1, answer=52))
        lanes = [lane.state for lane in core.status().models[0].lanes]
        if core.config.prefix_reuse:
            assert sorted(s.value for s in lanes) == ["free", "free", "free", "parked"], lanes
        two = run(core, turn_request(stranger, seed=2, answer=8))
        following = [*first, *(s[0] for s in one[0]), *range(300, 308)]
        return [one, two, run(core, turn_request(following, seed=3, answer=8))]

    with running_core(models, prefix_reuse=False) as cold:
        want = play(cold)
    with running_core(models) as warm:
        got = play(warm)
        assert_clean(warm)
    assert [steps for steps, _ in got] == [steps for steps, _ in want], "tokens or logprobs differ from a cold run"
    cached = [final.usage.cached_tokens for _, final in got]
    assert cached == [0, 0, len(first) + 52 - 1], f"cached tokens of (first turn, stranger, next turn): {cached}"


def test_a_long_prompt_in_chunks_equals_it_in_one_job(models: Path) -> None:
    prompt = [(13 * i + 1) % 500 for i in range(200)]
    req = turn_request(prompt, seed=5, answer=30)
    with running_core(models, prefill_chunk=CHUNK_OFF) as whole:
        want, _ = run(whole, req)
        jobs_whole = whole.device.counters().submitted
    with running_core(models, prefill_chunk=48) as chunked:
        rt = chunked.models.published("tiny")
        assert rt is not None and rt.prefill_chunk == 48
        got, _ = run(chunked, req)
        jobs_chunked = chunked.device.counters().submitted
        assert_clean(chunked)
    assert got == want, "chunked prefill must give the unchunked run's tokens and logprobs"
    assert jobs_chunked - jobs_whole == 200 // 48, "200 tokens in chunks of 48: 5 prefill jobs instead of 1"


class SecondSubmitHeld(HeldSubmitDevice):
    """calsim whose second `submit` after `hold_second()` blocks until `let_go()`: with chunks, the
    first chunk is done and the next one is on its way, deterministically (no timing)."""

    def __init__(self) -> None:
        super().__init__()
        self._before_hold: int | None = None

    def hold_second(self) -> None:
        self._before_hold = 1

    def submit(self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO) -> Any:
        if self._before_hold == 0:
            self._before_hold = None
            self.hold()
        elif self._before_hold is not None:
            self._before_hold -= 1
        return super().submit(model, job, engine_slot)


def test_a_cancel_part_way_through_a_chunked_prefill_frees_everything(models: Path) -> None:
    prompt = [(13 * i + 1) % 500 for i in range(200)]
    device = SecondSubmitHeld()
    core = DeviceCore(DaemonConfig(models_root=models, models=(("tiny", "tiny"),), prefill_chunk=16), device=device)
    core.start()
    try:
        device.hold_second()
        job = core.submit(turn_request(prompt, seed=5)).job_id
        assert device.entered.wait(60), "the second chunk was never submitted"
        core.cancel(job)  # the first chunk is done, the second on its way to the device
        device.let_go()
        _, final = finish(core, job)
        assert final.reason is FinishReason.CANCELLED and final.usage.completion_tokens == 0
        assert_clean(core)  # its lane is parked with the chunks done (trusted KV) or free
    finally:
        core.close()


def _first_turns(core: DeviceCore) -> tuple[list[int], GenerationRequest]:
    """Turn 1 of a chat; returns turn 2's prompt and request (its lane is parked now)."""
    prompt = [(7 * i + 3) % 500 for i in range(30)]
    steps, _ = run(core, turn_request(prompt, seed=1))
    second = [*prompt, *(s[0] for s in steps), 1, 2, 3]
    return second, turn_request(second, seed=2)


def _parked(core: DeviceCore) -> int:
    return sum(1 for m in core.status().models for lane in m.lanes if lane.state is LaneState.PARKED)


@pytest.mark.parametrize("between", ["ccu_exception", "nan_logits", "operator_ccu", "operator_configuration"])
def test_a_fault_or_reset_between_turns_drops_the_parked_kv(models: Path, between: str) -> None:
    with running_core(models, prefix_reuse=False) as cold:
        second, req = _first_turns(cold)
        want, _ = run(cold, req)
    with running_core(models, fault_injection=True) as core:
        second_again, req = _first_turns(core)
        assert second_again == second and _parked(core) == 1
        if between.startswith("operator"):
            core.reset(between.removeprefix("operator_"), "test")
            until("the model serves again", lambda: core.health().serving)
        else:  # a fault on another request's job: the board never trusts parked KV after it
            core.inject_fault(Fault(FaultKind(between)))
            run(core, turn_request([9, 9, 9], seed=3, answer=3))
        assert _parked(core) <= 1, "at most the other request's own lane parked after the fault"
        got, final = run(core, req)
        assert final.usage.cached_tokens == 0, "the next turn runs cold"
        assert got == want
        assert core.status().models[0].prefix_cache.dropped >= 1  # type: ignore[union-attr]
        assert_clean(core)


def test_an_unload_and_reload_between_turns_serves_the_next_turn_cold(models: Path) -> None:
    with running_core(models) as core:
        _, req = _first_turns(core)
        core.unload("tiny")
        core.load("tiny", "tiny")
        got, final = run(core, req)
        assert final.usage.cached_tokens == 0
    with running_core(models, prefix_reuse=False) as cold:
        _first_turns(cold)
        expected, _ = run(cold, req)
    assert got == expected


def test_a_daemon_that_trusts_dropped_kv_is_refused_by_the_device(
    models: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With dropping disabled (a bug), a configuration reset leaves the daemon trusting parked KV that
    the device cleared: calsim refuses the row (StaleKV) instead of computing on it, the daemon says
    so loudly, and the request still gets the cold run's tokens from a re-prefill."""
    monkeypatch.setattr(KVManager, "drop_parked", lambda self: [])
    with running_core(models, prefix_reuse=False) as cold:
        _, req = _first_turns(cold)
        want, _ = run(cold, req)
    with running_core(models) as core:
        _, req = _first_turns(core)
        core.reset("configuration", "test")
        until("the model serves again", lambda: core.health().serving)
        with caplog.at_level(logging.ERROR, logger="calculet.daemon.core.engine"):
            got, _ = run(core, req)
        assert any("stale KV" in r.getMessage() for r in caplog.records), "the device refused the stale row"
        assert got == want


def test_the_load_report_advertises_what_a_parked_lane_holds_and_its_tip(models: Path) -> None:
    prompt = [(7 * i + 3) % 500 for i in range(150)]
    with running_core(models) as core:
        steps, _ = run(core, turn_request(prompt, seed=1, answer=20))
        (model,) = core.load_report().models
        held = [*prompt, *(s[0] for s in steps)][:169]  # the lane: prompt + answer but its last token
        chain = block_hashes(held)
        assert model.parked_lanes == 1 and model.prefix_hashes is not None
        assert set(chain) <= set(model.prefix_hashes) and model.prefix_tips == (chain[-1],)
        assert model.package_hash and model.pending_prefill_tokens == 0
    with running_core(models, prefix_reuse=False) as off:
        run(off, turn_request(prompt, seed=1, answer=20))
        (model,) = off.load_report().models
        assert model.prefix_hashes is None and model.prefix_tips == () and model.parked_lanes == 0
