"""Issue 30, defect 3: a board whose unload left memory behind configures nothing more.

calsim's `release_leak_bytes` keeps that many bytes of every chip a released model used, until a
configuration reset; so the chips' memory counts the releases that happened since.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.models import LoadProgress
from calculet.daemon.core.switch import SwitchSpec
from calculet.daemon.errors import CalculetError, Unavailable

from .engine_factories import build_models, running_core

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
        old = core.models.serving("tiny")
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
