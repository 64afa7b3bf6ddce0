"""Issue 30, defects 3 and 4: a board whose unload left memory behind configures nothing more, and
only a reset that proves the memory back lifts its halt (docs/daemon.md, "Device memory").

calsim's `release_leak_bytes` keeps that many bytes of every chip a released model used, until a
configuration reset; so the chips' memory counts the releases that happened since.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.common.errors import CalculetError, ErrorKind, Unavailable
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.models import LoadProgress
from calculet.daemon.core.switch import SwitchSpec
from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.telemetry.daemon_metrics import DaemonMetrics
from tests.unit.telemetry.scrape import Scrape

from .engine_factories import build_models, finish, request, running_core

LEAK = 4096
LEAKY = {"release_leak_bytes": LEAK}
ONE_CALBIN_LEAKY = {"profile": "calrt-0.7.6", **LEAKY}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models(tmp_path_factory.mktemp("models"))


def dram(core: DeviceCore) -> list[int]:
    return [c.dram_used for c in core.device.memory_usage().chips]


def halt_by_a_leak(core: DeviceCore) -> None:
    """Load qwen beside tiny and unload it: the release keeps LEAK bytes per chip and the board halts."""
    core.load("qwen", "qwen")
    core.unload("qwen")
    assert not core.health().serving and "not verified" in core.health().reason


# ---- defect 3: a leaking device gets no new configuration ------------------------------------------


def test_a_switch_that_meets_a_leak_stops_at_the_first_one(models: Path) -> None:
    with running_core(models, device_options=ONE_CALBIN_LEAKY) as core:
        old = core.models.published("tiny")
        assert old is not None
        seen: list[LoadProgress] = []
        with pytest.raises(CalculetError) as info:
            core.load("qwen", "qwen", progress=seen.append, switch=SwitchSpec("tiny", old.generation))
        assert dram(core) == [LEAK, LEAK], "one release (tiny's), no configure of qwen nor of tiny again"
        assert isinstance(info.value, Unavailable) and "not verified" in str(info.value)
        assert not [p for p in seen if p.generation != old.generation and p.state is ModelState.CONFIGURING]
        assert core.models.all() == [] and not core.health().serving
        entry = core.status().reset_history[-1]
        assert (entry.kind, entry.ok) == ("switch", False)
        assert "tiny not loaded back as tiny" in entry.message and "waits for an operator reset" in entry.message


def test_a_replacing_load_that_meets_a_leak_stops_at_the_first_one(models: Path) -> None:
    with running_core(models, device_options=ONE_CALBIN_LEAKY) as core:
        with pytest.raises(CalculetError) as info:
            core.load("tiny", "tiny", replace=True)
        assert dram(core) == [LEAK, LEAK], "one release (the old generation's), the new one never configured"
        assert isinstance(info.value, Unavailable)
        assert "load of 'tiny' stopped: unload of tiny generation 1" in str(info.value)
        assert core.models.all() == []


def test_a_load_sent_to_a_halted_board_is_refused_before_it_configures_anything(models: Path) -> None:
    with running_core(models, device_options=LEAKY) as core:
        halt_by_a_leak(core)
        held = dram(core)
        seen: list[LoadProgress] = []
        with pytest.raises(CalculetError) as info:
            core.load("qwen", "qwen", progress=seen.append)
        assert dram(core) == held, "no configure, no release, no further leak"
        assert seen == [], "refused before it validated or configured anything"
        assert isinstance(info.value, Unavailable) and "waits for an operator reset" in str(info.value)
        assert [r.alias for r in core.models.all()] == ["tiny"]


# ---- defect 4: a halt lifts only with the memory back --------------------------------------------


def test_a_ccu_reset_frees_nothing_so_the_halt_stays_and_says_why(models: Path) -> None:
    with running_core(models, device_options=LEAKY) as core:
        halt_by_a_leak(core)
        report = core.operator_reset("ccu", "operator looks at the leak")
        assert not report.ok and report.error is not None and report.error.kind is ErrorKind.FAILED_PRECONDITION
        assert f"device memory is not back: chip 0 holds {LEAK:,} B DRAM" in report.message
        assert not core.health().serving, "the halt stays while the memory is not back"
        entry = core.status().reset_history[-1]
        assert (entry.kind, entry.fault, entry.ok) == ("ccu", "operator", False)
        assert "device memory is not back" in entry.message and not entry.serving_after
        with pytest.raises(Unavailable):
            core.load("qwen", "qwen")

        report = core.operator_reset("configuration", "operator reclaims the leak")
        assert report.ok, report.message
        assert core.health().serving and core.status().warnings == ()
        assert all(not c.held for c in core.status().memory_excess)
        core.load("qwen", "qwen")
        assert finish(core, core.submit(request((1, 2, 3), 4, seed=1, model="qwen")).job_id)[1].error_kind is None


def test_a_configuration_reset_with_no_model_loaded_says_the_memory_is_not_back(models: Path) -> None:
    with running_core(models, device_options=LEAKY) as core:
        core.unload("tiny")  # the only model: the board halts with no configuration left to reset through
        held = dram(core)
        assert held == [LEAK, LEAK] and not core.health().serving
        report = core.operator_reset("configuration", "operator reclaims the leak")
        assert not report.ok and report.error is not None and report.error.kind is ErrorKind.FAILED_PRECONDITION
        assert "restart the daemon" in report.message
        assert not core.health().serving
        entry = core.status().reset_history[-1]
        assert (entry.kind, entry.ok) == ("configuration", False) and "device memory is not back" in entry.message
        with pytest.raises(Unavailable):
            core.load("tiny", "tiny")
        assert dram(core) == held


def test_a_load_that_goes_serving_above_its_baseline_warns_in_status_and_a_metric(models: Path) -> None:
    made: list[DaemonMetrics] = []

    def leak_behind_the_daemons_back(core: DeviceCore) -> None:
        """Before the startup load: a model configured and released on the device itself, which keeps
        LEAK bytes per chip that no release the daemon verified could have caught."""
        made.append(DaemonMetrics(core))
        calsim = core.device.wrapped
        calsim.release(calsim.configure(models / "qwen", load_manifest(models / "qwen")))

    with running_core(models, device_options=LEAKY, before_start=leak_behind_the_daemons_back) as core:
        tiny = core.models.published("tiny")
        assert tiny is not None and tiny.state is ModelState.READY
        status = core.status()
        assert len(status.warnings) == 1 and "device memory above its baseline" in status.warnings[0]
        assert f"chip 1 holds {LEAK:,} B DRAM and 0 B SRAM above its baseline" in status.warnings[0]
        assert "above its baseline" in tiny.message, "the load's READY message says it too"
        body, _ = made[0].render()
        scrape = Scrape(body.decode())
        for chip in ("0", "1"):
            assert scrape.one("calculet_device_memory_above_baseline_bytes", chip=chip, memory="dram") == LEAK
            assert scrape.one("calculet_device_memory_above_baseline_bytes", chip=chip, memory="sram") == 0
    made[0].close()


def test_a_board_at_its_baseline_has_no_warning(models: Path) -> None:
    with running_core(models) as core:
        core.load("qwen", "qwen")
        core.unload("qwen")
        status = core.status()
        assert status.warnings == () and core.health().serving
        assert [c.held for c in status.memory_excess] == [False, False]


def test_a_configuration_reset_that_does_not_reclaim_the_leak_keeps_the_halt_and_fails_the_dropped_model(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime whose ResetConfiguration does not reclaim a leak (an open vendor question,
    docs/models.md): the halt stays, and tiny, which the reset dropped, is not configured again on the
    leaking device: it fails and leaves, its clients told UNAVAILABLE, instead of waiting forever."""
    with running_core(models, device_options=LEAKY) as core:
        halt_by_a_leak(core)
        monkeypatch.setattr(core.device.wrapped._memory, "clear_leaks", lambda: None)  # white-box: the runtime's gap
        tiny = core.models.published("tiny")
        assert tiny is not None
        report = core.operator_reset("configuration", "operator tries to reclaim the leak")
        assert not report.ok and "device memory is not back" in report.message
        assert not core.health().serving
        assert tiny.state is ModelState.UNLOADED and core.models.all() == []
        assert "waits for an operator reset" in tiny.message
        assert dram(core) == [LEAK, LEAK], "the reset dropped tiny; the leaked bytes stay; nothing configured since"
