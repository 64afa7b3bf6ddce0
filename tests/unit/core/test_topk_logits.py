"""A `topk` logits package through the real engine (issue 22): its decode jobs copy back each row's
top K, the tail maximum and a finite flag instead of the full row; the tokens and logprobs equal the
`full` package's for every kind of request; the full row is read from the device only when the top
K cannot decide (logprobs here), never for greedy or top-k within K; and the D2H bytes shrink."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.daemon.calsim.faults import Fault, FaultKind
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.request import GenerationRequest
from calculet.daemon.package.manifest import load_manifest
from calculet.ops.sim_packages.build import build_sim_package

from .engine_factories import assert_clean, finished_events, request, running_core

K = 32  # of the tiny package's 512-token vocabulary
PROMPT = (5, 17, 200, 33, 9, 401, 77)
TOKENS = 24
Step = tuple[int, float | None, tuple[tuple[int, float], ...]]

KINDS: dict[str, dict[str, object]] = {
    "greedy": {"temperature": 0.0},
    "top-k": {"temperature": 0.9, "top_k": 8},
    "top-k+top-p": {"temperature": 0.8, "top_k": 20, "top_p": 0.9},
    "top-p": {"temperature": 1.0, "top_p": 0.9},
    "min-p": {"temperature": 1.0, "min_p": 0.1},
    "temperature": {"temperature": 0.7},
    "logprobs": {"temperature": 0.8, "top_k": 10, "logprobs": 3},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("topk")
    build_sim_package("tiny", root / "tiny")
    build_sim_package("tiny", root / "tinytopk", logits_topk=K)
    return root


@pytest.fixture
def full(models: Path) -> Iterator[DeviceCore]:
    with running_core(models, model="tiny") as core:
        yield core


@pytest.fixture
def topk(models: Path) -> Iterator[DeviceCore]:
    with running_core(models, model="tinytopk", fault_injection=True) as core:
        yield core


def requests(model: str, kinds: list[str]) -> list[GenerationRequest]:
    return [request(PROMPT, TOKENS, seed=40 + i, model=model, **KINDS[kind]) for i, kind in enumerate(kinds)]


def run(core: DeviceCore, reqs: list[GenerationRequest]) -> list[list[Step]]:
    """Every request at once (they share decode batches), each one's steps."""
    ids = [core.submit(r).job_id for r in reqs]
    out = []
    for job_id in ids:
        events = finished_events(core, job_id, 60.0)
        final = events[-1]
        assert final.reason is FinishReason.LENGTH, final
        tokens = [t for e in events[:-1] for t in getattr(e, "tokens", ())]
        logprobs = [(lp.logprob, lp.top) for e in events[:-1] for lp in getattr(e, "logprobs", ())]
        out.append([(t, *(logprobs[i] if logprobs else (None, ()))) for i, t in enumerate(tokens)])
    return out


def test_the_package_declares_top_k_decode_outputs(models: Path) -> None:
    m = load_manifest(models / "tinytopk")
    assert (m.logits_output.mode, m.logits_output.k) == ("topk", K)
    decode = m.submodels_for("decode")[0]
    assert [t.name for t in decode.outputs] == ["topk_ids", "topk_values", "tail_max", "finite"]
    assert [t.name for t in m.submodels_for("prefill")[0].outputs] == ["logits"]  # prefill stays full


def test_every_kind_of_request_gets_the_full_packages_tokens_and_logprobs(full: DeviceCore, topk: DeviceCore) -> None:
    kinds = list(KINDS)
    expected = run(full, requests("tiny", kinds))
    got = run(topk, requests("tinytopk", kinds))
    for kind, want, have in zip(kinds, expected, got, strict=True):
        assert [s[0] for s in have] == [s[0] for s in want], kind
        for (_, lp_w, top_w), (_, lp_h, top_h) in zip(want, have, strict=True):
            assert lp_h == pytest.approx(lp_w, abs=1e-6) if lp_w is not None else lp_h is None, kind
            assert [t for t, _ in top_h] == [t for t, _ in top_w], kind
            assert [v for _, v in top_h] == pytest.approx([v for _, v in top_w], abs=1e-6), kind
    assert_clean(topk)


def test_the_full_row_is_read_only_when_the_top_k_cannot_decide(topk: DeviceCore) -> None:
    before = topk.device.full_row_reads()  # type: ignore[attr-defined]
    run(topk, requests("tinytopk", ["greedy", "top-k", "greedy"]))
    assert topk.device.full_row_reads() == before  # type: ignore[attr-defined]
    run(topk, requests("tinytopk", ["logprobs"]))
    reads = topk.device.full_row_reads() - before  # type: ignore[attr-defined]
    assert reads == TOKENS - 1  # every decode step of a logprobs request (its first token is prefill's)
    assert_clean(topk)


def test_the_decode_copies_shrink(full: DeviceCore, topk: DeviceCore) -> None:
    """Per generated token, the device-clock D2H seconds of the top-k package are a small part of
    the full package's (303 KB of the qwen vocabulary; here 1 KB of tiny's against K x 6 bytes)."""
    figures = []
    for core, model in ((full, "tiny"), (topk, "tinytopk")):
        before = core.status().utilization
        run(core, requests(model, ["greedy"] * 4))
        after = core.status().utilization
        tokens = after.generated_tokens - before.generated_tokens
        figures.append((after.d2h_seconds - before.d2h_seconds) / tokens)
    full_d2h, topk_d2h = figures
    assert topk_d2h < full_d2h / 2, figures


def test_a_decode_step_with_nan_logits_is_an_anomaly_recovered_exactly(full: DeviceCore, topk: DeviceCore) -> None:
    """The finite flag carries a NaN row's fault: the step is re-run (re-prefill) and the request
    ends with the undisturbed run's tokens, as with full logits."""
    expected = run(full, requests("tiny", ["temperature"]))
    topk.inject_fault(Fault(FaultKind.NAN_LOGITS, job=topk.next_job_index() + 5))  # a decode step
    got = run(topk, requests("tinytopk", ["temperature"]))
    assert [s[0] for s in got[0]] == [s[0] for s in expected[0]]
    assert topk.status().recoveries >= 1
    assert_clean(topk)


def test_status_counts_the_bytes_rows_and_full_reads(full: DeviceCore, topk: DeviceCore) -> None:
    """Utilization says what sampling copied: full rows of 512 bf16 logits a row, against top-k
    outputs of K x 6 + 3 bytes a row plus the rows read in full."""
    vocab = 512
    for core, model, kind, row_bytes, reads in (
        (full, "tiny", "logprobs", vocab * 2, 0),
        (topk, "tinytopk", "greedy", K * 6 + 3, 0),
        (topk, "tinytopk", "logprobs", K * 6 + 3, TOKENS - 1),
    ):
        before = core.status().utilization
        run(core, requests(model, [kind]))
        after = core.status().utilization
        rows = after.sampled_rows - before.sampled_rows
        assert rows == TOKENS  # the prefill's row, then one a decode step
        decode_bytes = (TOKENS - 1) * row_bytes + reads * vocab * 2
        assert after.d2h_bytes - before.d2h_bytes == vocab * 2 + decode_bytes, (model, kind)  # prefill: full
        assert after.full_row_reads - before.full_row_reads == reads, (model, kind)


def test_the_device_keeps_full_rows_only_for_registered_buffers(models: Path) -> None:
    """Kept rows are bounded by the job contexts; unregistering their buffers (a rebuild, an unload)
    lets the rows go, so resets and reloads never pile them up."""
    with running_core(models, model="tinytopk") as core:
        for _ in range(3):
            run(core, requests("tinytopk", ["greedy"] * 4))
        engine = core.device.wrapped._engine  # type: ignore[attr-defined]
        pool = core.status().pool
        assert 1 <= engine.kept_rows() <= pool.free + pool.in_use
        core.unload("tinytopk", timeout_s=10.0)
        assert engine.kept_rows() == 0
