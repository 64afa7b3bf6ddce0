"""`calculet.common.process_start`: the collector pauses and resumes only when this caller paused it,
with what the imports built frozen; OpenBLAS gets one thread unless the environment chose."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

from calculet.common import process_start


@pytest.fixture
def collector() -> Iterator[None]:
    was = gc.isenabled()  # this worker froze what it collected: the freeze counts are compared, not zeroed
    yield
    (gc.enable if was else gc.disable)()


def test_a_pause_of_a_running_collector_is_resumed_with_the_imports_frozen(collector: None) -> None:
    gc.enable()
    frozen = gc.get_freeze_count()
    paused = process_start.pause_collector()
    assert paused and not gc.isenabled()
    built = [[i] for i in range(1000)]  # what the imports build
    process_start.resume_collector(paused)
    assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(built)


def test_a_collector_someone_else_paused_stays_paused_and_nothing_is_frozen(collector: None) -> None:
    gc.disable()
    frozen = gc.get_freeze_count()
    paused = process_start.pause_collector()
    _ = [[i] for i in range(1000)]
    process_start.resume_collector(paused)
    assert not paused and not gc.isenabled() and gc.get_freeze_count() == frozen


def test_openblas_gets_one_thread_unless_the_environment_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    process_start.one_blas_thread()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    process_start.one_blas_thread()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4"
