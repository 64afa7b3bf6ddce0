"""`calctl rollout` against fake daemons: the calls each board gets and their order (Drain with the
window, Load with replace, Resume), one line per step, the first failure stopping the rollout with
the boards after it untouched, the failed board resumed on its old package (loaded again where the
failed load had unloaded it, as on a one-calbin board), and the checks that refuse a rollout before
anything changes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from calculet.ops.commands.rollout_board import BoardRollout, RolloutStep
from calculet.v1 import operate_pb2
from tests.unit.client.fake_daemon import Failure, FakeDaemon

from .calctl_fakes import calctl, served, usage_error

OPERATIONS = ("Drain", "Load", "Resume")


class OneCalbinFake(FakeDaemon):
    """A board that holds one calbin: a replacing load unloads the old generation first, so a load
    that fails leaves the alias unloaded."""

    def Load(self, request: operate_pb2.LoadRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        if request.options.replace and self.packages.get(request.package) is not None:
            with self.lock:
                self.models.pop(request.alias, None)
        yield from super().Load(request, context)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[list[str], list[FakeDaemon]]]:
    fakes: list[FakeDaemon] = [OneCalbinFake(), FakeDaemon(), FakeDaemon()]
    with contextlib.ExitStack() as stack:
        targets = [stack.enter_context(served(f, tmp_path / f"b{i}.sock")) for i, f in enumerate(fakes)]
        yield targets, fakes


def operations(fake: FakeDaemon) -> list[str]:
    with fake.lock:
        return [name for name, _, _ in fake.calls if name in OPERATIONS]


def daemons(targets: list[str]) -> list[str]:
    return [flag for target in targets for flag in ("--daemon", target)]


def test_every_board_drains_loads_and_resumes_in_turn(
    capsys: pytest.CaptureFixture[str], fleet: tuple[list[str], list[FakeDaemon]]
) -> None:
    targets, fakes = fleet
    code, out, err = calctl(capsys, "rollout", "tiny", "packages/tiny", *daemons(targets), "--drain-timeout", "2.5")
    assert (code, err) == (0, "")
    for fake in fakes:
        assert operations(fake) == ["Drain", "Load", "Resume"]
        ((drain, _),) = fake.calls_of("Drain")
        ((load, _),) = fake.calls_of("Load")
        assert drain.timeout_ms == 2500 and not drain.interrupt_remaining
        assert (load.alias, load.package, load.options.replace, load.options.drain_timeout_ms) == (
            "tiny", "packages/tiny", True, 2500,
        )  # fmt: skip
        assert not fake.draining and fake.models["tiny"].generation == 4
    lines = out.splitlines()
    assert lines[0] == "rollout of tiny to packages/tiny over 3 board(s), one at a time"
    assert lines[-1] == "rollout done: 3 board(s) serve tiny from packages/tiny"
    first = [line for line in lines if line.startswith("[1/3] ")]
    assert [line.split(": ", 1)[1].split(" ")[0] for line in first] == ["drained", "loaded", "resumed:", "serving"]
    assert "generation 4 READY (golden check passed)" in first[1]


def test_a_failed_load_stops_at_that_board_which_serves_its_old_package_again(
    capsys: pytest.CaptureFixture[str], fleet: tuple[list[str], list[FakeDaemon]]
) -> None:
    targets, fakes = fleet
    code, out, err = calctl(capsys, "rollout", "tiny", "packages/broken", *daemons(targets))
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"calctl: rollout stopped at board 1 of 3, fake-0 ({targets[0]}): load of packages/broken")
    assert err.rstrip().endswith(f"not touched: {targets[1]}, {targets[2]}")
    first = fakes[0]
    assert operations(first) == ["Drain", "Load", "Load", "Resume"]
    restore = first.calls_of("Load")[1][0]
    assert (restore.package, restore.options.replace) == ("packages/tiny", True)
    assert first.models["tiny"].package == "packages/tiny" and not first.draining
    assert "restored packages/tiny (the package before the rollout)" in out
    assert out.splitlines()[-1].endswith(": serving tiny again"), "it rejoined before calctl stopped"
    assert [operations(f) for f in fakes[1:]] == [[], []]


def test_where_the_old_generation_still_serves_it_is_only_resumed(
    capsys: pytest.CaptureFixture[str], fleet: tuple[list[str], list[FakeDaemon]]
) -> None:
    targets, fakes = fleet
    code, out, _ = calctl(capsys, "rollout", "tiny", "packages/broken", *daemons(targets[1:]))
    assert code == 1 and operations(fakes[1]) == ["Drain", "Load", "Resume"]
    assert "generation 3 (packages/tiny) still serves tiny" in out
    assert operations(fakes[2]) == []


def test_jobs_left_after_the_window_stop_before_the_load(
    capsys: pytest.CaptureFixture[str], fleet: tuple[list[str], list[FakeDaemon]]
) -> None:
    targets, fakes = fleet
    fakes[1].remaining_jobs = 2
    code, _, err = calctl(capsys, "rollout", "tiny", "packages/tiny", *daemons(targets))
    assert code == 1 and "board 2 of 3" in err and "drain: 2 job(s) still running" in err
    assert [operations(f) for f in fakes] == [["Drain", "Load", "Resume"], ["Drain", "Resume"], []]
    assert not fakes[1].draining

    code, _, _ = calctl(capsys, "rollout", "tiny", "packages/tiny", *daemons(targets[1:]), "--interrupt")
    assert code == 0 and fakes[1].calls_of("Drain")[-1][0].interrupt_remaining


def test_a_refused_operation_stops_the_rollout_and_the_board_is_resumed(
    capsys: pytest.CaptureFixture[str], fleet: tuple[list[str], list[FakeDaemon]]
) -> None:
    targets, fakes = fleet
    fakes[0].fail["Drain"] = Failure(grpc.StatusCode.PERMISSION_DENIED, "the operate plane needs its token")
    code, _, err = calctl(capsys, "rollout", "tiny", "packages/tiny", *daemons(targets))
    assert code == 1 and "draining: permission_denied: the operate plane needs its token" in err
    assert operations(fakes[0]) == ["Drain", "Resume"] and operations(fakes[1]) == []


@pytest.mark.parametrize(
    ("spoil", "problem"),
    [
        (lambda f: setattr(f, "draining", True), "draining already"),
        (lambda f: f.models.clear(), "does not serve 'tiny'"),
        (lambda f: f.fail.__setitem__("Status", Failure(grpc.StatusCode.UNAVAILABLE, "down")), "cannot be asked"),
    ],
)
def test_a_board_that_is_not_ready_for_it_refuses_the_rollout_before_any_change(
    capsys: pytest.CaptureFixture[str], fleet: tuple[list[str], list[FakeDaemon]], spoil: Any, problem: str
) -> None:
    targets, fakes = fleet
    spoil(fakes[2])
    code, out, err = calctl(capsys, "rollout", "tiny", "packages/tiny", *daemons(targets))
    assert (code, out) == (1, "")
    assert err.startswith("calctl: failed_precondition: rollout refused, nothing changed: ") and problem in err
    assert [operations(f) for f in fakes] == [[], [], []]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("rollout", "tiny"), "PACKAGE"),
        (("rollout", "tiny", "p", "--drain-timeout", "-1"), "between 0 and 3600"),
        (("rollout", "tiny", "p", "--rejoin-timeout", "x"), "expected a number"),
        (("rollout", "tiny", "p", "--json"), "unrecognized arguments: --json"),
        (("rollout", "tiny", "p", "--daemon", "unix:a.sock", "--gateway", "unix:g.sock"), "not both"),
    ],
)
def test_usage_errors(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    assert message in usage_error(capsys, *argv)


def test_a_board_listed_twice_is_refused(
    capsys: pytest.CaptureFixture[str], fleet: tuple[list[str], list[FakeDaemon]]
) -> None:
    targets, fakes = fleet
    code, _, err = calctl(capsys, "rollout", "tiny", "packages/tiny", *daemons([targets[0], targets[0]]))
    assert code == 1 and "listed twice" in err and operations(fakes[0]) == []


def test_ctrl_c_stops_the_rollout_and_says_which_board_to_check(
    capsys: pytest.CaptureFixture[str], fleet: tuple[list[str], list[FakeDaemon]], monkeypatch: pytest.MonkeyPatch
) -> None:
    targets, fakes = fleet

    def interrupted(self: BoardRollout, client: object) -> None:
        self.life.move(RolloutStep.LOADING)
        raise KeyboardInterrupt

    monkeypatch.setattr(BoardRollout, "_load", interrupted)
    code, _, err = calctl(capsys, "rollout", "tiny", "packages/tiny", *daemons(targets))
    assert code == 1 and err.count("\n") == 1 and "board 1 of 3" in err
    assert "interrupted while loading" in err and f"calctl status --daemon {targets[0]}" in err
    assert [operations(f) for f in fakes] == [["Drain"], [], []]
