"""The `--workers` supervisor with fake processes (no process is started): systemd hears READY=1 only
once every worker is ready and STOPPING=1 on stop; a worker that exits is started again after the
backoff's delay while the others keep running; failed starts in a row give the whole gateway up
(status 1, every worker stopped); stop terminates every worker and kills one that outlives the grace.
`RestartBackoff`'s delays are checked as plain numbers."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

import pytest

from calculet.common.sd_notify import Notifier
from calculet.gateway.workers.launcher import WorkerLauncher, WorkerProcess
from calculet.gateway.workers.restarts import RestartBackoff, RestartPolicy
from calculet.gateway.workers.supervisor import WorkerSupervisor

WAIT_S = 10.0  # a deadline for what the loop does on its own, never a pace
FAST = RestartPolicy(first_delay_s=0.001, max_delay_s=0.004, stable_s=3600, start_failures=3)


class FakeProcess(WorkerProcess):
    """A worker that exits when the test says, or on SIGTERM unless `stubborn`."""

    def __init__(self, pid: int, index: int, stubborn: bool = False) -> None:
        self._pid = pid
        self.index = index
        self.stubborn = stubborn
        self.signals: list[int] = []
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def pid(self) -> int:
        return self._pid

    def exit(self, code: int) -> None:
        if not self._exit.done():
            self._exit.set_result(code)

    @property
    def exited(self) -> bool:
        return self._exit.done()

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def terminate(self) -> None:
        self.signals.append(signal.SIGTERM)
        if not self.stubborn:
            self.exit(-signal.SIGTERM)

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.exit(-signal.SIGKILL)


class FakeLauncher(WorkerLauncher):
    """Starts FakeProcesses; `on_start(process)` may act on each (e.g. exit it at once)."""

    def __init__(self, on_start: Callable[[FakeProcess], None] = lambda p: None) -> None:
        self.started: list[FakeProcess] = []
        self.on_start = on_start
        self.refuse: set[int] = set()  # indexes whose start raises OSError
        self.gate: asyncio.Event | None = None  # when set, starts wait for it
        self.starting = 0  # starts begun

    async def start(self, index: int) -> WorkerProcess:
        self.starting += 1
        if self.gate is not None:
            await self.gate.wait()
        if index in self.refuse:
            raise OSError("no such interpreter")
        process = FakeProcess(1000 + len(self.started), index)
        self.started.append(process)
        self.on_start(process)
        return process

    def live(self, index: int) -> FakeProcess:
        (process,) = [p for p in self.started if p.index == index and not p.exited]
        return process


class RecordingNotifier(Notifier):
    def __init__(self) -> None:
        super().__init__(None)
        self.sent: list[tuple[str, ...]] = []

    def notify(self, *fields: str) -> bool:
        self.sent.append(fields)
        return True

    def kinds(self) -> list[str]:
        return [f[0].split("=")[0] for f in self.sent]


async def until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), WAIT_S * 2))


def test_ready_once_every_worker_is_ready_then_stopping_and_every_worker_stopped() -> None:
    async def scenario() -> None:
        launcher, notifier = FakeLauncher(), RecordingNotifier()
        supervisor = WorkerSupervisor(launcher, 2, notifier=notifier, policy=FAST)
        running = asyncio.create_task(supervisor.run())
        await until(lambda: len(launcher.started) == 2, "two workers started")
        first, second = launcher.started
        supervisor.worker_message(first.pid, ["READY=1", "STATUS=serving"])
        supervisor.worker_message(4242, ["READY=1"])  # not a worker: ignored
        assert notifier.sent == [("STATUS=starting: 1 of 2 workers ready",)] and supervisor.ready() == [True, False]
        supervisor.worker_message(second.pid, ["READY=1", "STATUS=serving"])
        assert notifier.sent[1:] == [("READY=1", "STATUS=serving: 2 workers")]
        supervisor.stop()
        assert await running == 0
        assert notifier.kinds() == ["STATUS", "READY", "STOPPING"]
        assert first.signals == second.signals == [signal.SIGTERM]
        assert supervisor.pids() == [None, None] and supervisor.started == 2

    run(scenario)


def test_a_worker_that_exits_is_started_again_and_the_others_keep_running() -> None:
    async def scenario() -> None:
        launcher, notifier = FakeLauncher(), RecordingNotifier()
        supervisor = WorkerSupervisor(launcher, 2, notifier=notifier, policy=FAST)
        running = asyncio.create_task(supervisor.run())
        await until(lambda: len(launcher.started) == 2, "two workers started")
        for process in launcher.started:
            supervisor.worker_message(process.pid, ["READY=1"])
        first, second = launcher.started
        first.exit(-signal.SIGKILL)
        await until(lambda: len(launcher.started) == 3, "worker 0 started again")
        again = launcher.started[2]
        assert again.index == 0 and supervisor.pids() == [again.pid, second.pid]
        assert supervisor.ready() == [False, True] and not second.signals
        supervisor.worker_message(again.pid, ["READY=1"])
        assert notifier.kinds() == ["STATUS", "READY", "STATUS", "STATUS"]  # READY=1 once; else how many are ready
        assert notifier.sent[-1] == ("STATUS=serving: 2 of 2 workers ready",)
        supervisor.stop()
        assert await running == 0

    run(scenario)


def test_failed_starts_in_a_row_give_the_gateway_up() -> None:
    async def scenario() -> None:
        launcher = FakeLauncher(on_start=lambda p: p.exit(1) if p.index == 0 else None)
        supervisor = WorkerSupervisor(launcher, 2, notifier=RecordingNotifier(), policy=FAST)
        assert await supervisor.run() == 1
        assert [p.index for p in launcher.started].count(0) == FAST.start_failures
        (other,) = [p for p in launcher.started if p.index == 1]
        assert other.signals == [signal.SIGTERM] and supervisor.gave_up

    run(scenario)


def test_a_launcher_error_is_a_failed_start() -> None:
    async def scenario() -> None:
        launcher = FakeLauncher()
        launcher.refuse.add(1)
        supervisor = WorkerSupervisor(launcher, 2, policy=FAST)
        assert await supervisor.run() == 1
        assert [p.index for p in launcher.started] == [0] and launcher.started[0].signals == [signal.SIGTERM]

    run(scenario)


def test_a_worker_still_there_after_the_grace_is_killed() -> None:
    async def scenario() -> None:
        launcher = FakeLauncher(on_start=lambda p: setattr(p, "stubborn", p.index == 1))
        supervisor = WorkerSupervisor(launcher, 2, policy=FAST, stop_grace_s=0.01)
        running = asyncio.create_task(supervisor.run())
        await until(lambda: len(launcher.started) == 2, "two workers started")
        supervisor.stop()
        assert await running == 0
        assert [p.signals for p in launcher.started] == [[signal.SIGTERM], [signal.SIGTERM, signal.SIGKILL]]

    run(scenario)


def test_a_worker_that_finishes_starting_after_stop_is_stopped() -> None:
    async def scenario() -> None:
        launcher = FakeLauncher()
        launcher.gate = asyncio.Event()
        supervisor = WorkerSupervisor(launcher, 1, policy=FAST)
        running = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.starting == 1, "the start begun")
        supervisor.stop()  # while the start is under way
        launcher.gate.set()
        assert await running == 0
        (process,) = launcher.started
        assert process.signals == [signal.SIGTERM] and process.exited

    run(scenario)


def test_no_ready_is_announced_while_stopping() -> None:
    async def scenario() -> None:
        launcher, notifier = FakeLauncher(), RecordingNotifier()
        supervisor = WorkerSupervisor(launcher, 1, notifier=notifier, policy=FAST)
        running = asyncio.create_task(supervisor.run())
        await until(lambda: len(launcher.started) == 1, "the worker started")
        launcher.started[0].stubborn = True
        supervisor.stop()
        await until(lambda: launcher.started[0].signals == [signal.SIGTERM], "the worker told to stop")
        supervisor.worker_message(launcher.started[0].pid, ["READY=1"])
        launcher.started[0].exit(0)
        assert await running == 0
        assert notifier.kinds() == ["STOPPING"]

    run(scenario)


# ---- RestartBackoff -----------------------------------------------------------------------------


def test_delays_double_up_to_the_most() -> None:
    backoff = RestartBackoff(RestartPolicy(first_delay_s=0.5, max_delay_s=3, stable_s=30, start_failures=99))
    assert [backoff.exited(ready_for_s=1.0) for _ in range(5)] == [0.5, 1.0, 2.0, 3, 3]


def test_a_stable_run_starts_the_delays_over() -> None:
    backoff = RestartBackoff(RestartPolicy(first_delay_s=0.5, max_delay_s=10, stable_s=30, start_failures=99))
    assert [backoff.exited(ready_for_s=1.0) for _ in range(3)] == [0.5, 1.0, 2.0]
    assert backoff.exited(ready_for_s=30.0) == 0.5
    assert backoff.exited(ready_for_s=1.0) == 1.0


@pytest.mark.parametrize("limit", [1, 3])
def test_failed_starts_in_a_row_give_up_and_a_ready_run_resets_the_count(limit: int) -> None:
    backoff = RestartBackoff(RestartPolicy(first_delay_s=0.5, max_delay_s=10, stable_s=30, start_failures=limit))
    for _ in range(limit - 1):
        assert backoff.exited(ready_for_s=None) is not None
    assert backoff.exited(ready_for_s=5.0) is not None  # it served: the count starts over
    for _ in range(limit - 1):
        assert backoff.exited(ready_for_s=None) is not None
    assert backoff.exited(ready_for_s=None) is None
    assert backoff.failed_starts == limit
