"""Jump-forward's threshold from a package's declared timing (`daemon/core/jump.py`): a forced run
jumps when its prefill costs less than the stream's share of the decode steps it replaces; on the
qwen preset's timing one stream jumps any run, 4 streams in a batch-4 step only runs of 21 or more,
16 in a batch-16 step none; an undeclared package has no thresholds; `settle_run` takes a run that
ends the sequence whatever the threshold."""

from __future__ import annotations

import pytest

from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.jump import jump_thresholds, min_jump_run, settle_run
from calculet.daemon.grammar.matcher import ForcedRun
from calculet.daemon.package.manifest import PackageManifest, load_manifest
from calculet.ops.sim_packages.build import build_sim_package

from .engine_factories import request


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> PackageManifest:
    root = tmp_path_factory.mktemp("jump-threshold")
    return load_manifest(build_sim_package("qwen3-30b-a3b", root / "qwen", decode_batches=(1, 4, 16), lanes=16,
                                           lane_context=1024))  # fmt: skip


def _prefill(m: PackageManifest, tokens: int) -> float:
    return m.timing.prefill_fixed_ms + m.timing.prefill_ms_per_token * tokens


def _step(m: PackageManifest, batch: int) -> float:
    return m.timing.decode_curve[0].ms_per_token * (1 + m.timing.batch_alpha * (batch - 1))


@pytest.mark.parametrize(("running", "batch", "expected"), [(1, 1, 1), (4, 4, 21), (16, 16, 0)])
def test_the_threshold_is_where_the_prefill_beats_the_streams_share(
    qwen: PackageManifest, running: int, batch: int, expected: int
) -> None:
    k = min_jump_run(qwen.timing, running, batch)
    assert k == expected
    if k:  # the run of k pays, the run of k - 1 (if any) does not
        assert _prefill(qwen, k + 1) < (k + 1) * _step(qwen, batch) / running
        assert k == 1 or _prefill(qwen, k) >= k * _step(qwen, batch) / running


def test_thresholds_follow_the_decode_submodel_per_running_count(qwen: PackageManifest) -> None:
    batches = {1: 1, **dict.fromkeys(range(2, 5), 4), **dict.fromkeys(range(5, 17), 16)}
    table = jump_thresholds(qwen, "prefill", batches.__getitem__, 16)
    assert len(table) == 16 and table[0] == 1 and table[3] == 21 and table[15] == 0
    undeclared = qwen.submodels[0].__class__(**{**qwen.submodels[0].__dict__, "prefill_at_offset": None})
    plain = qwen.__class__(**{**qwen.__dict__, "submodels": (undeclared, *qwen.submodels[1:])})
    assert jump_thresholds(plain, "prefill", batches.__getitem__, 16) == ()


def test_a_run_that_ends_the_sequence_is_taken_at_any_threshold() -> None:
    from calculet.daemon.core.client_job import ClientJob

    seq = ClientJob("j", request((1, 2), max_tokens=10, seed=0, ignore_eos=False), 1, frozenset({99}))
    assert settle_run(seq, ForcedRun((5, 6), completes=True), 0) == ((5, 6), FinishReason.STOP)
    assert settle_run(seq, ForcedRun((5, 99, 7)), 0) == ((5, 99), FinishReason.STOP)
    assert settle_run(seq, ForcedRun((5, 6)), 0) is None  # no jump pays now: decode it
    assert settle_run(seq, ForcedRun((5, 6)), 3) is None  # too short
    assert settle_run(seq, ForcedRun((5, 6, 7)), 3) == ((5, 6, 7), None)
    assert settle_run(seq, ForcedRun(tuple(range(9))), 0) == (tuple(range(9)), FinishReason.LENGTH)
