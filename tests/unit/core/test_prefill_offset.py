"""Prefill at an offset (`prefill_offset.py`, `offset_probe.py`; docs/daemon.md, "Prefill at an
offset"): what a package declares and the load's offset check proves decide whether a generation
chunks prompts and reuses prefixes.

The verdicts on a running core (calsim, time scale 0, no process): declared and sound (PROVEN,
chunking and reuse on), declared but the calbin ignores `past_kv_len` (the calsim fault: REFUTED,
both off, and a long prompt and its next turn give a cold run's tokens), undeclared (both off, no
probe), and forced on (the load fails with `PrefillOffsetRefused`). The rules themselves are checked
as pure functions first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from calculet.daemon.calsim.kernel import make_kernel
from calculet.daemon.calsim.offset_blind import OffsetBlindKernel
from calculet.daemon.core.client_job import ProbeShape
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.engine_types import ProbeOutcome
from calculet.daemon.core.events import FinalEvent, FinishReason, Timings, Usage
from calculet.daemon.core.observe.status import ModelView
from calculet.daemon.core.offset_probe import prove_offset, split_point
from calculet.daemon.core.prefill_offset import (
    OffsetVerdict,
    OffsetWants,
    PrefillOffsetRefused,
    decide,
    undeclared_reason,
)
from calculet.daemon.core.prefix_match import LaneSource, ParkedView, choose_lane
from calculet.daemon.core.request import GenerationRequest
from calculet.daemon.package.manifest import load_manifest
from calculet.ops.sim_packages.build import build_sim_package
from tests.unit.core.engine_factories import finish, generate_each, request, running_core

DECLARED, UNDECLARED = "tiny", "tinysteps"
CHUNK = 16  # small chunks, so a 100-token prompt would run as 7 prefill jobs where chunking is on
LONG = tuple(range(3, 103))  # 100 tokens, within tiny's prefill bucket: one job where chunking is off


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("offset")
    build_sim_package("tiny", root / DECLARED)  # declares prefill_at_offset: true
    build_sim_package("tiny", root / UNDECLARED, prefill_at_offset=None)  # the same weights, undeclared
    return root


# ---- the rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize("verdict", [OffsetVerdict.REFUTED, OffsetVerdict.UNDECLARED])
def test_an_unproven_offset_turns_chunking_reuse_and_jumps_off(verdict: OffsetVerdict) -> None:
    d = decide(verdict, "why", OffsetWants())
    assert (d.chunked, d.prefix_reuse, d.jump, d.allowed) == (False, False, False, False)
    assert verdict.value in d.summary() and "why" in d.summary()


def test_a_proven_offset_serves_as_the_settings_ask() -> None:
    d = decide(OffsetVerdict.PROVEN, "ok", OffsetWants(chunk=False, reuse=True))
    assert (d.chunked, d.prefix_reuse, d.jump, d.allowed) == (False, True, True, True)


@pytest.mark.parametrize(
    ("wants", "named"),
    [
        (OffsetWants(chunk_forced=True), "chunked prefill forced on"),
        (OffsetWants(reuse_forced=True), "prefix reuse forced on"),
        (OffsetWants(chunk_forced=True, reuse_forced=True), "chunked prefill and prefix reuse forced on"),
    ],
)
def test_an_unproven_offset_forced_on_is_refused(wants: OffsetWants, named: str) -> None:
    with pytest.raises(PrefillOffsetRefused, match=named):
        decide(OffsetVerdict.UNDECLARED, "no declaration", wants)
    assert decide(OffsetVerdict.PROVEN, "ok", wants).allowed  # forced and proven: served


@pytest.mark.parametrize(
    ("declared", "said"), [(None, "does not declare"), (False, "declares prefill_at_offset: false")]
)
def test_undeclared_means_absent_or_false(models: Path, declared: bool | None, said: str) -> None:
    manifest = load_manifest(models / DECLARED)
    assert undeclared_reason(manifest) is None
    prefill = manifest.submodels_for("prefill")[0]
    sub = prefill.__class__(**{**prefill.__dict__, "prefill_at_offset": declared})
    other = manifest.__class__(**{**manifest.__dict__, "submodels": (sub, *manifest.submodels_for("decode"))})
    reason = undeclared_reason(other)
    assert reason is not None and said in reason


def test_the_continued_probe_keeps_at_most_its_cap_and_still_continues_the_lane() -> None:
    # A lane holding the golden prompt (17) and 7 decoded tokens: the next turn would keep 16; the
    # probe truncates to 9, and it is still that lane's continuation (taken though a lane is FREE).
    prompt = np.arange(17, dtype=np.int32)
    parked = ParkedView(lane=2, tokens=np.arange(24, dtype=np.int32), last_used=1, prompt_len=17)
    assert choose_lane(prompt, [parked], {0, 1}, 1).keep == 16
    capped = choose_lane(prompt, [parked], {0, 1}, 1, max_keep=split_point(17))
    assert capped is not None and (capped.lane, capped.source, capped.keep) == (2, LaneSource.HIT, 9)


def _outcome(tokens: tuple[int, ...], logits: np.ndarray, cached: int = 0) -> ProbeOutcome:
    final = FinalEvent(0, FinishReason.LENGTH, Usage(4, len(tokens), 0, cached), Timings(0, 0, 0, 0, 0))
    return ProbeOutcome(final, tokens, logits, cached_tokens=cached)


def test_the_probe_proves_only_identical_runs_and_runs_continued_before_chunked() -> None:
    logits = np.arange(8, dtype=np.float32)
    whole = _outcome((1, 2), logits)
    shapes: list[ProbeShape] = []

    def runs(continued: ProbeOutcome, chunked: ProbeOutcome):  # type: ignore[no-untyped-def]
        def run(shape: ProbeShape, tokens: int) -> ProbeOutcome:
            shapes.append(shape)
            return continued if shape.keep else dataclasses.replace(chunked, tokens=chunked.tokens[:tokens])

        return run

    same, kept = _outcome((1, 2), logits.copy()), _outcome((1, 2), logits.copy(), cached=2)
    assert prove_offset(runs(kept, same), whole, 4)[0] is OffsetVerdict.PROVEN
    assert shapes == [ProbeShape(keep=2), ProbeShape(chunk=2)]
    nudged = logits.copy()
    nudged[3] += np.float32(0.5)
    verdict, why = prove_offset(runs(kept, _outcome((1, 2), nudged)), whole, 4)
    assert verdict is OffsetVerdict.REFUTED and "chunked run's first logits differ" in why
    verdict, why = prove_offset(runs(_outcome((1, 3), logits, cached=2), same), whole, 4)
    assert verdict is OffsetVerdict.REFUTED and "continued run decoded [1, 3]" in why
    verdict, why = prove_offset(runs(same, same), whole, 4)  # took a lane cold: proves nothing
    assert verdict is OffsetVerdict.REFUTED and "kept 0 KV tokens" in why


def test_a_probe_run_a_device_fault_made_re_prefill_runs_again() -> None:
    logits = np.arange(8, dtype=np.float32)
    whole = _outcome((1, 2), logits)
    recovered = dataclasses.replace(_outcome((1, 2), logits, cached=2), recoveries=1)
    shapes: list[ProbeShape] = []
    answers = iter([recovered, whole, _outcome((1, 2), logits, cached=2), whole])

    def run(shape: ProbeShape, tokens: int) -> ProbeOutcome:
        shapes.append(shape)
        return next(answers)

    assert prove_offset(run, whole, 4)[0] is OffsetVerdict.PROVEN
    # The retry of the continued run needs a parked lane again: a whole run that parks one first.
    assert shapes == [ProbeShape(keep=2), ProbeShape(chunk=4, park=True), ProbeShape(keep=2), ProbeShape(chunk=2)]
    always = iter([recovered, whole, recovered])
    verdict, why = prove_offset(lambda _shape, _tokens: next(always), whole, 4)
    assert verdict is OffsetVerdict.REFUTED and "re-prefill from scratch" in why


def test_the_fault_kernel_is_exact_at_offset_zero_and_wrong_after_it(models: Path) -> None:
    manifest = load_manifest(models / DECLARED)
    good = make_kernel(manifest, models / DECLARED, 1, 64)
    blind = OffsetBlindKernel(make_kernel(manifest, models / DECLARED, 1, 64))
    tokens, positions = np.arange(5, 25, dtype=np.int32), np.arange(20, dtype=np.int32)
    whole = good.prefill(0, 0, tokens, positions)
    assert np.array_equal(blind.prefill(0, 0, tokens, positions), whole)
    blind.prefill(0, 0, tokens[:10], positions[:10])
    assert not np.array_equal(blind.prefill(0, 10, tokens[10:], positions[10:]), whole)


# ---- on a running core -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(models: Path) -> list[list[int]]:
    """A cold run of the long prompt and of its next turn: each one prefill at offset 0."""
    with running_core(models, model=DECLARED, prefix_reuse=False, prefill_chunk=-1) as core:
        return generate_each(core, _turns())


def _turns() -> list[GenerationRequest]:
    """The long prompt, then its next turn (the first turn's prompt and three more tokens)."""
    return [request(LONG, 6, 1), request((*LONG, 7, 8, 9), 6, 1)]


@pytest.fixture
def faulty(models: Path) -> Iterator[DeviceCore]:
    options = {"prefill_ignores_offset": True}
    with running_core(models, model=DECLARED, prefill_chunk=CHUNK, device_options=options) as core:
        yield core


def _offset(core: DeviceCore, alias: str) -> ModelView:
    """The alias's model in Status."""
    (m,) = [m for m in core.status().models if m.alias == alias]
    return m


def test_declared_and_sound_is_proven_and_serves_chunked_with_reuse(models: Path, reference: list[list[int]]) -> None:
    with running_core(models, model=DECLARED, prefill_chunk=CHUNK) as core:
        m = _offset(core, DECLARED)
        d = m.prefill_offset
        assert d is not None and d.verdict is OffsetVerdict.PROVEN, d
        assert (d.chunked, d.prefix_reuse, d.jump) == (True, True, True)
        assert m.prefill_chunk_tokens == CHUNK and m.prefix_cache.enabled and m.prefix_cache.parked_lanes == 0
        first, second = _turns()
        assert finish(core, core.submit(first).job_id)[0] == reference[0]
        tokens, final = finish(core, core.submit(second).job_id)
        assert tokens == reference[1] and final.usage.cached_tokens > 0  # reused, and still exact
        assert m.prefix_cache.hits == 0  # the probe's own reuse is not counted as a client's


def test_a_calbin_ignoring_the_offset_is_caught_and_answers_as_a_cold_run(
    faulty: DeviceCore, reference: list[list[int]]
) -> None:
    m = _offset(faulty, DECLARED)
    d = m.prefill_offset
    assert d is not None and d.verdict is OffsetVerdict.REFUTED, d
    assert "the continued run's first logits differ" in d.reason
    assert (d.chunked, d.prefix_reuse, d.jump) == (False, False, False)
    assert "refuted" in m.message and not m.prefix_cache.enabled
    rt = faulty.models.published(DECLARED)
    assert rt is not None and m.prefill_chunk_tokens == rt.manifest.submodels_for("prefill")[-1].max_tokens
    assert rt.jump_min_runs == () and rt.kv is not None and rt.kv.parked_count() == 0
    first, second = _turns()
    assert finish(faulty, faulty.submit(first).job_id)[0] == reference[0]
    tokens, final = finish(faulty, faulty.submit(second).job_id)
    assert tokens == reference[1] and final.usage.cached_tokens == 0


def test_an_undeclared_package_serves_without_chunks_or_reuse_and_runs_no_probe(models: Path) -> None:
    with running_core(models, model=UNDECLARED, prefill_chunk=CHUNK) as core:
        m = _offset(core, UNDECLARED)
        d = m.prefill_offset
        assert d is not None and d.verdict is OffsetVerdict.UNDECLARED
        assert "does not declare prefill_at_offset" in d.reason and not (d.chunked or d.prefix_reuse or d.jump)
        rt = core.models.published(UNDECLARED)
        assert rt is not None and not m.prefix_cache.enabled
        golden_jobs = len(rt.manifest.golden.decode_tokens)  # one prefill, then a decode step per later token
        assert core.device.counters().submitted == golden_jobs  # the golden check alone: no offset probe


@pytest.mark.parametrize("forced", ["prefix_reuse_forced", "prefill_chunk_forced"])
def test_forced_on_an_undeclared_package_fails_its_load_before_configuring(models: Path, forced: str) -> None:
    with running_core(models, model=DECLARED, **{forced: True}) as core:
        assert _offset(core, DECLARED).prefill_offset.allowed  # declared and proven: forced is fine
        before = core.device.memory_usage()
        with pytest.raises(PrefillOffsetRefused, match="forced on, but the package's prefill is not proven"):
            core.load("steps", UNDECLARED)
        assert core.device.memory_usage() == before and core.models.published("steps") is None


def test_forced_on_a_calbin_ignoring_the_offset_fails_its_load(models: Path) -> None:
    options = {"time_scale": 0.0, "profile": "calsim-dev", "prefill_ignores_offset": True}
    config = DaemonConfig(
        models_root=models, models=((DECLARED, DECLARED),), device_options=options, prefix_reuse_forced=True
    )
    core = DeviceCore(config)
    try:
        with pytest.raises(PrefillOffsetRefused, match="refuted: the continued run's first logits differ"):
            core.start()
        assert core.models.published(DECLARED) is None
    finally:
        core.close()
