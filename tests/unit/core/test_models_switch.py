"""A switch on a one-calbin board (Load with a SwitchSpec): compare-and-swap, minimum residency,
phases reported and audited, concurrent switches, and a failed load that loads the old model back."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from calculet.common.errors import Aborted, CalculetError, FailedPrecondition
from calculet.common.phase_clock import PHASES
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.switch import SwitchSpec

from .engine_factories import build_models, finish, request, running_core

ONE_CALBIN = {"profile": "calrt-0.7.6"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_models(tmp_path_factory.mktemp("models"))
    shutil.copytree(root / "tiny", root / "broken")  # validates, then fails its golden check
    manifest = json.loads((root / "broken" / "calculet-package.json").read_text())
    manifest["golden"]["decode_tokens"][3] = (manifest["golden"]["decode_tokens"][3] + 1) % 512
    (root / "broken" / "calculet-package.json").write_text(json.dumps(manifest))
    return root


def test_a_switch_drains_unloads_loads_and_audits_each_phase(models: Path) -> None:
    with running_core(models, device_options=ONE_CALBIN) as core:
        old = core.models.published("tiny")
        assert old is not None
        job = core.submit(request((1, 2, 3), 30, seed=1)).job_id
        seen: list[tuple[int, ModelState]] = []
        spec = SwitchSpec("tiny", old.generation, reason="demand for qwen", requester="test")
        new = core.load("qwen", "qwen", progress=lambda p: seen.append((p.generation, p.state)), switch=spec)
        tokens, final = finish(core, job)
        assert len(tokens) == 30 and final.reason is FinishReason.LENGTH, "the old model's job finished first"
        assert old.state is ModelState.UNLOADED and core.models.published("tiny") is None
        assert new.state is ModelState.READY and core.models.published("qwen") is new
        old_states = [s for g, s in seen if g == old.generation]
        assert old_states == [ModelState.DRAINING, ModelState.UNLOADING, ModelState.UNLOADED]
        assert seen.index((old.generation, ModelState.UNLOADED)) < seen.index((new.generation, ModelState.CONFIGURING))
        entry = core.status().reset_history[-1]
        assert (entry.kind, entry.ok, entry.automatic) == ("switch", True, False)
        assert entry.reason == f"demand for qwen (asked by test): tiny@{old.generation} -> qwen@{new.generation}"
        assert all(f"{phase} " in entry.message for phase in PHASES), entry.message
        assert entry.inflight_jobs == entry.recovered and entry.failed == 0  # drained, none cut off
        assert len(core.device.memory_usage().chips) == 2 and core.health().serving


def test_a_stale_expectation_is_aborted_and_changes_nothing(models: Path) -> None:
    with running_core(models, device_options=ONE_CALBIN) as core:
        old = core.models.published("tiny")
        assert old is not None
        with pytest.raises(
            Aborted, match=f"expected tiny@{old.generation + 1} but the board serves tiny@{old.generation}"
        ):
            core.load("qwen", "qwen", switch=SwitchSpec("tiny", old.generation + 1))
        with pytest.raises(Aborted, match="board serves no other"):
            core.load("qwen", "qwen", switch=SwitchSpec("other", 1))
        assert core.models.published("tiny") is old and old.state is ModelState.READY
        assert core.status().reset_history == ()


def test_the_minimum_residency_holds_unless_forced(models: Path) -> None:
    with running_core(models, device_options=ONE_CALBIN, min_residency_s=3600.0) as core:
        old = core.models.published("tiny")
        assert old is not None
        with pytest.raises(FailedPrecondition, match="less than the minimum residency 3600 s"):
            core.load("qwen", "qwen", switch=SwitchSpec("tiny", old.generation))
        assert old.state is ModelState.READY
        new = core.load("qwen", "qwen", switch=SwitchSpec("tiny", old.generation, force=True))
        assert core.models.published("qwen") is new


def test_two_switches_of_one_generation_exactly_one_happens(models: Path) -> None:
    with running_core(models, device_options=ONE_CALBIN) as core:
        old = core.models.published("tiny")
        assert old is not None
        outcomes: dict[str, object] = {}
        go = threading.Barrier(2)

        def switch(alias: str) -> None:
            go.wait()
            try:
                outcomes[alias] = core.load(
                    alias, alias if alias == "qwen" else "tiny", switch=SwitchSpec("tiny", old.generation)
                )
            except CalculetError as exc:
                outcomes[alias] = exc

        threads = [threading.Thread(target=switch, args=(a,)) for a in ("qwen", "tiny2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        won = [a for a, o in outcomes.items() if not isinstance(o, CalculetError)]
        lost = [o for o in outcomes.values() if isinstance(o, CalculetError)]
        assert len(won) == 1 and len(lost) == 1 and isinstance(lost[0], Aborted), outcomes
        assert [r.alias for r in core.models.all() if r.model is not None] == won
        assert [e.kind for e in core.status().reset_history] == ["switch"]


def test_a_switch_whose_load_fails_loads_the_old_package_back(models: Path) -> None:
    with running_core(models, device_options=ONE_CALBIN) as core:
        old = core.models.published("tiny")
        assert old is not None
        with pytest.raises(FailedPrecondition, match="golden decode mismatch"):
            core.load("broken", "broken", switch=SwitchSpec("tiny", old.generation, reason="try broken"))
        back = core.models.published("tiny")
        assert back is not None and back.generation > old.generation and back.state is ModelState.READY
        assert core.models.published("broken") is None
        entry = core.status().reset_history[-1]
        assert entry.kind == "switch" and not entry.ok
        assert f"tiny loaded back as tiny@{back.generation}" in entry.message
        tokens, final = finish(core, core.submit(request((1, 2, 3), 5, seed=1)).job_id)
        assert len(tokens) == 5 and final.reason is FinishReason.LENGTH
