"""Byte progress of package validation: `ByteThrottle` (first, at most one per 1 % of the total and
per 0.25 s, whichever comes later, last) and `validate_package(on_bytes=...)` on a built tiny
package, with clocks the tests drive (never the machine's speed)."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from calculet.daemon.package import files
from calculet.daemon.package.byte_progress import ByteThrottle
from calculet.daemon.package.manifest import load_manifest
from calculet.daemon.package.validate import validate_package
from calculet.ops.sim_packages.build import build_sim_package

Report = tuple[int, int]


class StepClock:
    """A clock that moves `step` seconds every time it is read (0: it never moves)."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sim_package("tiny", tmp_path_factory.mktemp("pkg") / "tiny")


def _total(package: Path, skip: str = "") -> int:
    return sum(f.size for f in load_manifest(package).files if f.path != skip)


def _validate(package: Path, clock: Callable[[], float], verify_hashes: bool = True) -> tuple[list[Report], list[str]]:
    reports: list[Report] = []
    report = validate_package(
        package, verify_hashes=verify_hashes, on_bytes=lambda d, t: reports.append((d, t)), clock=clock
    )
    return reports, report.codes


def _check_throttled(reports: list[Report], total: int) -> None:
    """First (0, total), last (total, total), rising, and at least 1 % apart in between."""
    assert total > 0 and reports[0] == (0, total) and reports[-1] == (total, total)
    assert all(t == total for _, t in reports)
    done = [d for d, _ in reports]
    assert done == sorted(set(done)), "byte counts must rise strictly"
    least = math.ceil(total / 100)
    assert all(b - a >= least for a, b in itertools.pairwise(done[:-1])), done  # the last may be closer
    assert len(reports) <= 102


# ---------------------------------------------------------------- ByteThrottle


def test_throttle_with_time_to_spare_reports_once_per_percent() -> None:
    got: list[Report] = []
    throttle = ByteThrottle(lambda d, t: got.append((d, t)), clock=StepClock(1.0))
    throttle.start(10_000)
    for done in range(1, 10_001):
        throttle.update(done)
    throttle.finish()
    assert got == [(d, 10_000) for d in range(0, 10_001, 100)]


def test_throttle_with_a_clock_that_never_moves_reports_first_and_last_only() -> None:
    got: list[Report] = []
    throttle = ByteThrottle(lambda d, t: got.append((d, t)), clock=StepClock(0.0))
    throttle.start(1000)
    for done in range(1, 1000):
        throttle.update(done)
    assert got == [(0, 1000)]
    throttle.finish()
    throttle.finish()  # idempotent
    assert got == [(0, 1000), (1000, 1000)]


def test_throttle_waits_for_a_quarter_second_when_percents_come_faster() -> None:
    now = [0.0]
    got: list[tuple[int, float]] = []
    throttle = ByteThrottle(lambda d, t: got.append((d, now[0])), clock=lambda: now[0])
    throttle.start(100)
    for done in range(1, 100):  # 1 % every 0.1 s: a report every third percent (0.3 s >= 0.25 s)
        now[0] = done / 10
        throttle.update(done)
    assert [d for d, _ in got] == [0, *range(3, 100, 3)]
    assert all(b - a >= 0.25 for (_, a), (_, b) in itertools.pairwise(got))


def test_throttle_reports_the_total_at_once_and_ignores_counts_going_back() -> None:
    got: list[Report] = []
    throttle = ByteThrottle(lambda d, t: got.append((d, t)), clock=StepClock(0.0))
    throttle.start(50)
    throttle.update(20)  # held back: the clock has not moved
    throttle.update(10)
    throttle.update(80)  # beyond the total: clamped, and the total is always reported
    throttle.update(50)
    throttle.finish()
    assert got == [(0, 50), (50, 50)]


def test_throttle_of_nothing_reports_nothing() -> None:
    got: list[Report] = []
    throttle = ByteThrottle(lambda d, t: got.append((d, t)))
    throttle.start(0)
    throttle.update(10)
    throttle.finish()
    assert got == []


@pytest.mark.parametrize(
    ("kw", "message"),
    [({"step": 0.0}, "step: must be in"), ({"step": 1.5}, "step: must be in"), ({"interval_s": -1.0}, "interval_s")],
)
def test_throttle_refuses_bad_settings(kw: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ByteThrottle(lambda d, t: None, **kw)


def test_throttle_refuses_a_negative_total() -> None:
    with pytest.raises(ValueError, match="total: must be >= 0, got -1"):
        ByteThrottle(lambda d, t: None).start(-1)


# ---------------------------------------------------------------- validate_package(on_bytes)


def test_validation_reports_bytes_rising_to_the_total_of_the_manifest(tiny: Path) -> None:
    reports, codes = _validate(tiny, StepClock(1.0))
    assert codes == []
    _check_throttled(reports, _total(tiny))


def test_validation_in_small_reads_is_throttled_to_one_report_per_percent(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "sha256_file", functools.partial(files.sha256_file, chunk=4096))
    reports, codes = _validate(tiny, StepClock(1.0))
    total = _total(tiny)
    assert codes == [] and total // 4096 > 150  # far more reads than reports
    _check_throttled(reports, total)
    assert len(reports) >= 60  # the 1 % rule, not the clock, set the pace


def test_validation_with_a_stopped_clock_reports_first_and_last(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "sha256_file", functools.partial(files.sha256_file, chunk=4096))
    reports, _ = _validate(tiny, StepClock(0.0))
    total = _total(tiny)
    assert reports == [(0, total), (total, total)]


def test_a_file_of_the_wrong_size_is_not_counted(tmp_path: Path) -> None:
    package = build_sim_package("tiny", tmp_path / "tiny")
    with (package / "param_blk1.bin").open("ab") as f:
        f.write(b"\0")
    reports, codes = _validate(package, StepClock(1.0))
    assert codes == ["file.size"]
    _check_throttled(reports, _total(package, skip="param_blk1.bin"))


def test_a_file_that_fails_midway_still_ends_at_the_total(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = files.sha256_file

    def failing(path: Path, chunk: int = files.HASH_CHUNK, on_chunk: Callable[[int], None] | None = None) -> str:
        if path.name == "param_blk0.bin":
            assert on_chunk is not None
            on_chunk(1000)
            raise OSError(5, "Input/output error", str(path))
        return real(path, chunk, on_chunk)

    monkeypatch.setattr(files, "sha256_file", failing)
    reports, codes = _validate(tiny, StepClock(1.0))
    assert codes == ["file.unreadable"]
    _check_throttled(reports, _total(tiny))


def test_no_bytes_are_reported_without_hashing(tiny: Path) -> None:
    reports, codes = _validate(tiny, StepClock(1.0), verify_hashes=False)
    assert (reports, codes) == ([], [])
