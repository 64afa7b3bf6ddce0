"""Two calbins on one board: single-chip models side by side on a 1.0.0 driver, refused on 0.7.6;
and an unload that does not give its memory back stops the board (docs/sources.md 000 §9, §10.3, §17)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from calculet.common.errors import FailedPrecondition, Unavailable
from calculet.daemon.core.model_state import ModelState
from calculet.ops.sim_packages import build_sim_package

from .engine_factories import build_models, finish, request, running_core

PROMPT = (151_644, 872, 198, 9707, 11, 1879, 0)  # any Qwen3 ids


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """qwen3-4b built for chip 0 and for chip 1 (2 lanes of 512 tokens, so building is quick)."""
    root = tmp_path_factory.mktemp("dense")
    for chip in (0, 1):
        build_sim_package("qwen3-4b", root / f"dense{chip}", decode_batches=[1, 2], lane_context=512, chip=chip)
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models(tmp_path_factory.mktemp("models"))


def solo_tokens(dense: Path, alias: str, seed: int) -> tuple[int, ...]:
    with running_core(dense, model=alias, device_options={"profile": "calrt-1.0.0"}) as core:
        tokens, _ = finish(core, core.submit(request(PROMPT, 12, seed, temperature=1.0, model=alias)).job_id)
        return tuple(tokens)


def test_on_a_1_0_0_driver_chip_0_and_chip_1_serve_two_models_at_once(dense: Path) -> None:
    expected = {alias: solo_tokens(dense, alias, seed) for alias, seed in (("dense0", 1), ("dense1", 2))}
    with running_core(dense, model="dense0", device_options={"profile": "calrt-1.0.0"}) as core:
        core.load("dense1", "dense1")
        used = [c.dram_used for c in core.device.memory_usage().chips]
        assert all(u > 0 for u in used), "each model holds its own chip"
        jobs = {
            alias: core.submit(request(PROMPT, 12, seed, temperature=1.0, model=alias)).job_id
            for alias, seed in (("dense0", 1), ("dense1", 2))
        }
        got = {alias: tuple(finish(core, job)[0]) for alias, job in jobs.items()}
    assert got == expected


def test_on_the_0_7_6_profile_the_same_packages_are_refused_with_the_reason(dense: Path) -> None:
    with running_core(dense, model="dense0", device_options={"profile": "calrt-0.7.6"}) as core:
        with pytest.raises(FailedPrecondition, match=r"driver 0\.7\.6-calsim holds one|driver 0\.7\.6 holds one"):
            core.load("dense1", "dense1")
        assert [r.alias for r in core.models.all()] == ["dense0"]


def test_a_package_without_a_matrix_never_shares_a_board(dense: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(dense / "dense0", root / "dense0")
    shutil.copytree(dense / "dense1", root / "bare")
    path = root / "bare" / "calculet-package.json"
    raw = json.loads(path.read_text())
    del raw["compatibility"]["matrix"]
    path.write_text(json.dumps(raw))
    with (
        running_core(root, model="dense0", device_options={"profile": "calrt-1.0.0"}) as core,
        pytest.raises(FailedPrecondition, match="declares no compatibility matrix"),
    ):
        core.load("bare", "bare")


def test_an_unload_that_leaks_stops_the_board_and_the_audit_says_why(models: Path) -> None:
    with running_core(models, device_options={"release_leak_bytes": 4096}) as core:
        core.load("qwen", "qwen")
        core.unload("qwen")
        health = core.health()
        assert not health.serving and "unload of qwen generation" in health.reason
        assert "chip 0 still holds 4,096 B DRAM" in health.reason
        entry = core.status().reset_history[-1]
        assert (entry.kind, entry.ok, entry.fault) == ("unload", False, "unload_leak")
        assert "not verified" in entry.message and entry.serving_before and not entry.serving_after
        with pytest.raises(Unavailable, match="waits for an operator reset"):
            core.submit(request((1, 2, 3), 4, seed=1))
        # A configuration reset reclaims the leak (a CCU reset frees nothing and no longer lifts the
        # halt: issue 30, tests/unit/core/test_leak_halt.py); tiny is configured and warmed again.
        report = core.operator_reset("configuration", "operator reclaims the leak")
        assert report.ok and core.health().serving
        assert core.models.published("tiny") is not None and core.models.published("tiny").state is ModelState.READY
