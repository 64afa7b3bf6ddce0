"""`GuardedDevice` on a device without lane selection: a hand-built job with a row off its slot is
refused before the device sees it (the acceptance's hidden check), whatever device is underneath.

The device underneath is `UncheckedFakeDevice`, which takes any job, so every refusal here is the
guard's; each test also shows the fake taking the same job.
"""

from __future__ import annotations

import numpy as np
import pytest

from calculet.daemon.device.api import HostBuffer
from calculet.daemon.device.errors import LaneBusy, RowOffSlot
from calculet.daemon.device.guard import GuardedDevice, GuardedSubmission
from calculet.daemon.device.slots import check_slot_rows, slot_rows
from calculet.daemon.device.types import EngineSlot, InactiveRows, JobSpec, JobStatus, RowSpec, TaskType
from tests.unit.core.fakes import FakeModel, FakeSubmission, submodel
from tests.unit.device.test_guard import UncheckedFakeDevice

DECODE = submodel("decode_b4", TaskType.DECODE, 4, 1, 8)
PREFILL = submodel("prefill", TaskType.PREFILL, 1, 8, 8)


def rig(rule: InactiveRows) -> tuple[GuardedDevice, UncheckedFakeDevice, FakeModel]:
    fake = UncheckedFakeDevice(ping_pong=True, lane_selection=False, inactive_rows=rule)
    model = fake.configure_fake({"decode_b4": DECODE, "prefill": PREFILL}, 4, 16, 8)
    return GuardedDevice(fake), fake, model


def job(guard: GuardedDevice, name: str, rows: list[RowSpec]) -> JobSpec:
    info = DECODE if name == "decode_b4" else PREFILL
    bufs: list[HostBuffer] = [
        guard.register_buffer(np.zeros((info.batch, info.max_tokens), dtype=np.int32)) for _ in range(3)
    ]
    return JobSpec(
        name, {"tokens": bufs[0].buffer_id, "positions": bufs[1].buffer_id}, {"logits": bufs[2].buffer_id}, tuple(rows)
    )


@pytest.mark.parametrize(
    "rows",
    [
        [RowSpec(1, 0, 1)],  # one sequence, in row 0, on lane 1
        [RowSpec(1, 0, 1), RowSpec(0, 0, 1)],  # two, crossed
        [RowSpec(0, 0, 1), RowSpec.masked(1), RowSpec(3, 0, 1)],  # row 2 on lane 3
    ],
)
def test_a_hand_built_job_with_a_row_off_its_slot_is_refused_by_the_guard(rows: list[RowSpec]) -> None:
    guard, fake, model = rig(InactiveRows.ONLY_VALID)
    spec = job(guard, "decode_b4", rows)
    with pytest.raises(RowOffSlot, match="without lane selection row"):
        guard.submit(model, spec, EngineSlot.PING)
    assert guard.view().lanes == frozenset()  # nothing held
    assert isinstance(fake.submit(model, spec, EngineSlot.PING), FakeSubmission)  # the fake takes it


def test_the_guard_holds_the_rule_for_idle_rows_and_a_masked_slot_holds_no_lane() -> None:
    guard, fake, model = rig(InactiveRows.ALL)
    with pytest.raises(RowOffSlot, match="all names every one of its 4 rows"):
        guard.submit(model, job(guard, "decode_b4", [RowSpec(0, 0, 1)]), EngineSlot.PING)
    rows = slot_rows({2: RowSpec(2, 0, 1)}, DECODE, InactiveRows.ALL)
    assert rows == (RowSpec.masked(0), RowSpec.masked(1), RowSpec(2, 0, 1), RowSpec.masked(3))
    decode = guard.submit(model, job(guard, "decode_b4", list(rows)), EngineSlot.PING)
    assert guard.view().lanes == {(model.config_id, 2)}
    # Slot 0 is idle in the decode job: a prefill may fill it meanwhile (a batch-1 prefill names its slot).
    prefill = guard.submit(model, job(guard, "prefill", [RowSpec(0, 0, 4)]), EngineSlot.PONG)
    assert guard.view().lanes == {(model.config_id, 2), (model.config_id, 0)}
    assert isinstance(prefill, GuardedSubmission) and isinstance(prefill.inner, FakeSubmission)
    fake.finish(prefill.inner)
    assert prefill.wait(1) is JobStatus.DONE
    with pytest.raises(LaneBusy):  # slot 2 is still the decode job's
        guard.submit(model, job(guard, "prefill", [RowSpec(2, 1, 1)]), EngineSlot.PONG)
    assert isinstance(decode, GuardedSubmission) and isinstance(decode.inner, FakeSubmission)


def test_with_lane_selection_any_lane_is_taken_and_a_masked_row_is_left_to_the_device() -> None:
    check_slot_rows([RowSpec(3, 0, 1), RowSpec(1, 0, 1)], DECODE, True, InactiveRows.ONLY_VALID)
    fake = UncheckedFakeDevice(ping_pong=True)
    model = fake.configure_fake({"decode_b4": DECODE}, 4, 16, 8)
    guard = GuardedDevice(fake)
    sub = guard.submit(model, job(guard, "decode_b4", [RowSpec(3, 0, 1)]), EngineSlot.PING)
    assert isinstance(sub, GuardedSubmission) and isinstance(sub.inner, FakeSubmission)
    fake.finish(sub.inner)
    assert sub.wait(1) is JobStatus.DONE
