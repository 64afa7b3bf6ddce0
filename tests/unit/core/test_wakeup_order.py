"""A settled job's Wait-stream wake-ups go out after the next device job is submitted (so streaming
its tokens never competes with that submit for the GIL), and every token still reaches its stream.

Deterministic: the first submit (the prefill) is held until the test has subscribed, and each later
submit runs the check on the engine thread, at the moment the device is handed the next job."""

from __future__ import annotations

from pathlib import Path

from calculet.daemon.calsim.handles import CalsimSubmission
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.core.events import EventLog, deferred_listeners
from calculet.daemon.device.api import ConfiguredModel
from calculet.daemon.device.types import EngineSlot, JobSpec
from calculet.ops.sim_packages.build import build_sim_package
from tests.unit.server.held_device import HeldSubmitDevice

from .engine_factories import finish, request

TOKENS = 8
CALL_S = 30.0


class WatchingDevice(HeldSubmitDevice):
    """At each submit, records (tokens appended to the watched log, wake-ups its listener got)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: EventLog | None = None
        self.woken = 0
        self.at_submit: list[tuple[int, int]] = []

    def submit(
        self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO
    ) -> CalsimSubmission:
        if self.log is not None:
            self.at_submit.append((self.log.token_count, self.woken))
        return super().submit(model, job, engine_slot)

    def wake(self) -> None:
        self.woken += 1


def test_the_next_job_is_submitted_before_the_last_token_is_streamed(tmp_path: Path) -> None:
    build_sim_package("tiny", tmp_path / "models" / "tiny")
    device = WatchingDevice()
    core = DeviceCore(DaemonConfig(models_root=tmp_path / "models", models=(("tiny", "tiny"),)), device=device)
    core.start()
    try:
        device.hold()
        job_id = core.submit(request((5, 6, 7), TOKENS, seed=1)).job_id
        assert device.entered.wait(CALL_S), "the engine never submitted the prefill"
        log = core.event_log(job_id, for_wait=True)
        log.subscribe(device.wake)
        device.log = log
        device.let_go()
        tokens, _ = finish(core, job_id)
        assert len(tokens) == TOKENS
        decodes = [(n, woken) for n, woken in device.at_submit if n > 0]
        # Each decode job follows the token before it, whose wake-up the engine still holds then.
        assert decodes == [(n, n - 1) for n in range(1, TOKENS)], device.at_submit
        assert log.finished and device.woken == TOKENS + 1  # every token and the Final woke it
    finally:
        core.close()


def test_deferred_listeners_collect_instead_of_calling_and_do_not_nest() -> None:
    log = EventLog("job", 0)
    calls: list[str] = []
    log.subscribe(lambda: calls.append("woken"))
    with deferred_listeners() as woken:
        log.append_tokens((1,))
        assert calls == [] and len(woken) == 1
        try:
            with deferred_listeners():
                raise AssertionError("nested block entered")
        except RuntimeError:
            pass
    log.append_tokens((2,))
    assert calls == ["woken"]  # outside the block, listeners are called at once again
    woken[0]()
    assert calls == ["woken", "woken"]
