"""`GuardedDevice`: the daemon's device invariants hold whatever device is underneath.

Most tests run the guard over calsim with `checks=False`, which makes none of the refusals a real
runtime does not make either, so each refusal here is the guard's: each test also shows the device
underneath accepting the same job (or call), so it fails if the guard's check were removed. One
group runs the guard over `UncheckedFakeDevice`, a core test fake without those checks, to show the
guard needs nothing of calsim. A hypothesis test drives random submit / wait / unregister /
register sequences and checks the guard's books against a model of the unfinished jobs.

Jobs finish at once (time_scale 0) but the guard holds them until their `wait` (or `status`) says
so, so nothing here depends on machine speed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calculet.daemon.calsim.device import CalsimDevice, CalsimDriver, CalsimModel
from calculet.daemon.calsim.options import parse_options
from calculet.daemon.device.api import ConfiguredModel, HostBuffer, Submission
from calculet.daemon.device.errors import (
    BufferInUse,
    DeviceError,
    DeviceLost,
    EngineBusy,
    InvalidJob,
    LaneBusy,
    ModelReleased,
)
from calculet.daemon.device.guard import GuardedDevice, GuardedSubmission
from calculet.daemon.device.types import EngineSlot, JobCounters, JobSpec, JobStatus, RowSpec, TaskType
from tests.unit.calsim.factories import (
    DECODE1,
    DECODE4,
    LANES,
    Bufs,
    Gate,
    KernelBox,
    decode_spec,
    is_poison,
    make_bufs,
    make_manifest,
)
from tests.unit.core.fakes import FakeDevice, FakeModel, FakeSubmission, submodel

# ---------------------------------------------------------------- calsim without checks, guarded


def open_unchecked(kernels: KernelBox | None = None, **options: Any) -> CalsimDevice:
    """A calsim board with `checks=False` (time_scale 0, the fake kernel)."""
    opts: dict[str, Any] = {
        "time_scale": 0.0,
        "kernel_factory": kernels or KernelBox(),
        "checks": False,
        "profile": "calsim-dev",  # two resident models
    }
    opts.update(options)
    return CalsimDriver().open(0, opts)


@pytest.fixture
def guard() -> Iterator[GuardedDevice]:
    device = GuardedDevice(open_unchecked())
    yield device
    device.close()


@pytest.fixture
def model(guard: GuardedDevice, tmp_path: Path) -> CalsimModel:
    model = guard.configure(tmp_path, make_manifest())
    assert isinstance(model, CalsimModel)
    return model


def calsim(guard: GuardedDevice) -> CalsimDevice:
    assert isinstance(guard.wrapped, CalsimDevice)
    return guard.wrapped


def bufs(guard: GuardedDevice, model: ConfiguredModel, name: str = DECODE1) -> Bufs:
    """Tokens / positions / logits buffers for submodel `name`, registered through the guard."""
    info = model.submodel(name)
    shape = (info.batch, info.max_tokens)
    return Bufs(
        name,
        guard.register_buffer(np.zeros(shape, dtype=np.int32)),
        guard.register_buffer(np.zeros(shape, dtype=np.int32)),
        guard.register_buffer(np.zeros((info.batch, model.vocab_size), dtype=ml_dtypes.bfloat16)),
    )


def underneath_accepts(guard: GuardedDevice, model: ConfiguredModel, spec: JobSpec, slot: EngineSlot) -> None:
    """The device under the guard takes the job the guard refused (so the refusal was the guard's)."""
    assert calsim(guard).submit(model, spec, slot).wait(5) is JobStatus.DONE


def test_guard_refuses_a_buffer_held_by_an_unwaited_job(guard: GuardedDevice, model: CalsimModel) -> None:
    a, b = bufs(guard, model), bufs(guard, model)
    first = guard.submit(model, decode_spec(a, [(0, 0, 1)]), EngineSlot.PING)
    shared = decode_spec(b, [(1, 0, 2)])
    shared.outputs["logits"] = a.logits.buffer_id
    with pytest.raises(BufferInUse, match=f"buffer {a.logits.buffer_id} is held by job {first.job_id}"):
        guard.submit(model, shared, EngineSlot.PONG)
    underneath_accepts(guard, model, shared, EngineSlot.PONG)
    assert first.wait(5) is JobStatus.DONE
    assert guard.submit(model, shared, EngineSlot.PONG).wait(5) is JobStatus.DONE  # held until wait only


def test_status_done_frees_lanes_and_bank_but_buffers_only_after_wait(guard: GuardedDevice, model: CalsimModel) -> None:
    a, b = bufs(guard, model), bufs(guard, model)
    first = guard.submit(model, decode_spec(a, [(0, 0, 1)]), EngineSlot.PING)
    assert isinstance(first, GuardedSubmission)
    assert first.inner.wait(5) is JobStatus.DONE  # finished on the device; the guard has not seen it
    with pytest.raises(LaneBusy):
        guard.submit(model, decode_spec(b, [(0, 1, 2)]), EngineSlot.PONG)
    assert first.status() is JobStatus.DONE  # now it has: lanes and bank are free
    assert guard.view().unfinished == frozenset() and guard.view().unwaited == {first.job_id}
    again = decode_spec(a, [(1, 0, 3)])
    with pytest.raises(BufferInUse, match="finished, but its wait has not returned"):
        guard.submit(model, again, EngineSlot.PING)  # the outputs are the job's until wait returns
    assert guard.submit(model, decode_spec(b, [(0, 1, 2)]), EngineSlot.PING).wait(5) is JobStatus.DONE
    assert first.wait(5) is JobStatus.DONE
    assert guard.submit(model, again, EngineSlot.PING).wait(5) is JobStatus.DONE


def test_guard_refuses_a_lane_another_unfinished_job_advances(
    guard: GuardedDevice, model: CalsimModel, tmp_path: Path
) -> None:
    a, b = bufs(guard, model), bufs(guard, model, DECODE4)
    first = guard.submit(model, decode_spec(a, [(2, 0, 1)]), EngineSlot.PING)
    busy = decode_spec(b, [(0, 0, 5), (2, 0, 6)])
    with pytest.raises(LaneBusy, match=f"lane 2 of model 'tiny' is being advanced by job {first.job_id}"):
        guard.submit(model, busy, EngineSlot.PONG)
    underneath_accepts(guard, model, busy, EngineSlot.PONG)
    other = guard.configure(tmp_path, make_manifest("other"))
    c = bufs(guard, other)
    assert guard.submit(other, decode_spec(c, [(2, 0, 1)]), EngineSlot.PONG).wait(5) is JobStatus.DONE  # other model
    first.wait(5)
    assert guard.submit(model, busy, EngineSlot.PONG).wait(5) is JobStatus.DONE


def test_guard_refuses_a_busy_bank_and_the_inflight_limit(guard: GuardedDevice, model: CalsimModel) -> None:
    a, b, c = bufs(guard, model), bufs(guard, model), bufs(guard, model)
    first = guard.submit(model, decode_spec(a, [(0, 0, 1)]), EngineSlot.PING)
    on_ping = decode_spec(b, [(1, 0, 1)])
    with pytest.raises(EngineBusy, match=f"engine bank ping has job {first.job_id} in flight"):
        guard.submit(model, on_ping, EngineSlot.PING)
    underneath_accepts(guard, model, on_ping, EngineSlot.PING)
    second = guard.submit(model, on_ping)  # AUTO: calsim picks a bank, the guard learns which
    assert second.engine_slot in (EngineSlot.PING, EngineSlot.PONG)
    third = decode_spec(c, [(2, 0, 1)])
    with pytest.raises(EngineBusy, match="takes 2 job"):
        guard.submit(model, third)
    underneath_accepts(guard, model, third, EngineSlot.AUTO)
    first.wait(5)
    second.wait(5)
    assert guard.submit(model, third).wait(5) is JobStatus.DONE


def test_guard_refuses_a_buffer_not_registered_through_it(guard: GuardedDevice, model: CalsimModel) -> None:
    a = bufs(guard, model)
    direct = make_bufs(calsim(guard), model, DECODE1)  # registered on calsim, behind the guard's back
    spec = decode_spec(direct, [(0, 0, 1)])
    with pytest.raises(InvalidJob, match=r"buffer\(s\) \[\d+, \d+, \d+\] not registered"):
        guard.submit(model, spec)
    underneath_accepts(guard, model, spec, EngineSlot.AUTO)
    for buf in (a.tokens, a.positions, a.logits):
        guard.unregister_buffer(buf)
    with pytest.raises(InvalidJob, match="not registered"):
        guard.submit(model, decode_spec(a, [(0, 0, 1)]))
    assert guard.view().registered == frozenset()


def test_guard_refuses_to_unregister_a_buffer_an_unwaited_job_holds(guard: GuardedDevice, model: CalsimModel) -> None:
    a = bufs(guard, model)
    sub = guard.submit(model, decode_spec(a, [(0, 0, 1)]))
    with pytest.raises(BufferInUse, match=f"buffer {a.tokens.buffer_id} is held by job {sub.job_id}"):
        guard.unregister_buffer(a.tokens)
    assert a.tokens.buffer_id in guard.view().registered  # still registered, still usable
    assert sub.wait(5) is JobStatus.DONE
    guard.unregister_buffer(a.tokens)
    assert a.tokens.buffer_id not in guard.view().registered


def test_holds_end_when_wait_returns(guard: GuardedDevice, model: CalsimModel) -> None:
    a, b = bufs(guard, model), bufs(guard, model, DECODE4)
    first = guard.submit(model, decode_spec(a, [(0, 0, 1)]), EngineSlot.PING)
    second = guard.submit(model, decode_spec(b, [(1, 0, 1), (3, 0, 2)]), EngineSlot.PONG)
    view = guard.view()
    assert view.unfinished == view.unwaited == {first.job_id, second.job_id}
    assert view.buffers == {x.buffer_id for x in (a.tokens, a.positions, a.logits, b.tokens, b.positions, b.logits)}
    assert view.lanes == {(model.config_id, 0), (model.config_id, 1), (model.config_id, 3)}
    assert first.wait(5) is JobStatus.DONE
    view = guard.view()
    assert view.unwaited == {second.job_id} and (model.config_id, 0) not in view.lanes
    assert second.wait(5) is JobStatus.DONE
    view = guard.view()
    assert view.unfinished == view.unwaited == view.buffers == view.lanes == frozenset()
    assert not is_poison(a.out(0)) and not is_poison(b.out(1))


def test_reset_ccu_and_close_end_every_hold(guard: GuardedDevice, model: CalsimModel) -> None:
    a, b = bufs(guard, model), bufs(guard, model)
    guard.submit(model, decode_spec(a, [(0, 0, 1)]), EngineSlot.PING)
    guard.submit(model, decode_spec(b, [(1, 0, 1)]), EngineSlot.PONG)
    guard.reset_ccu()
    assert guard.view().buffers == frozenset()
    guard.unregister_buffer(a.logits)  # the daemon quarantines and unregisters after a reset
    late = guard.submit(model, decode_spec(b, [(0, 0, 1)]))
    guard.close()
    view = guard.view()
    assert view.unwaited == view.buffers == view.registered == frozenset()
    with pytest.raises(DeviceLost):
        late.wait(5)
    with pytest.raises(DeviceLost):
        guard.submit(model, decode_spec(b, [(0, 0, 1)]))


def test_status_of_a_running_job_keeps_its_holds(tmp_path: Path) -> None:
    guard = GuardedDevice(open_unchecked(fault_plan={"faults": [{"kind": "hang", "job": 0}]}))
    try:
        model = guard.configure(tmp_path, make_manifest())
        a = bufs(guard, model)
        hung = guard.submit(model, decode_spec(a, [(0, 0, 1)]))
        assert not hung.status().finished
        with pytest.raises(LaneBusy):
            guard.submit(model, decode_spec(bufs(guard, model), [(0, 0, 1)]))
        guard.reset_ccu()
        assert hung.wait(5) is JobStatus.CCU_EXCEPTION
        assert guard.view().unwaited == frozenset()
    finally:
        guard.close()


def test_guard_forwards_what_the_contract_does_not_name(guard: GuardedDevice, model: CalsimModel) -> None:
    a = bufs(guard, model)
    assert guard.next_job_index() == 0  # calsim's fault hooks reach the daemon through the guard
    sub = guard.submit(model, decode_spec(a, [(0, 0, 1)]))
    assert isinstance(sub, GuardedSubmission)
    assert sub.wait(5) is JobStatus.DONE
    assert sub.history() == (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.DONE)
    assert guard.counters().finished == 1 and guard.healthy()
    assert guard.info().capabilities.max_inflight == 2


# ---------------------------------------------------------------- calsim's checks option


def test_checks_option_parses_a_bool_only() -> None:
    assert parse_options({}).checks is True
    assert parse_options({"checks": False}).checks is False
    with pytest.raises(InvalidJob, match="checks: expected true or false"):
        parse_options({"checks": "no"})


def test_calsim_without_checks_accepts_what_a_real_runtime_accepts(tmp_path: Path) -> None:
    kernels = KernelBox()
    device = open_unchecked(kernels)
    gate = Gate()
    try:
        model = device.configure(tmp_path, make_manifest())
        a, b, c = (make_bufs(device, model, DECODE1) for _ in range(3))
        kernels.built[0].gate = gate
        first = device.submit(model, decode_spec(a, [(0, 0, 1)]), EngineSlot.PING)
        assert gate.entered.wait(5)  # `first` is in flight until the gate opens
        same_bank_lane = device.submit(model, decode_spec(b, [(0, 0, 2)]), EngineSlot.PING)
        third = device.submit(model, decode_spec(c, [(1, 0, 3)]))
        shared = decode_spec(c, [(2, 0, 4)])
        fourth = device.submit(model, shared)  # c is named by `third` too
        device.unregister_buffer(a.tokens)  # held by `first`
        gate.open()
        statuses = [s.wait(5) for s in (first, same_bank_lane, third, fourth)]
        assert statuses == [JobStatus.DONE] * 4
        assert device.counters().left == 0
    finally:
        gate.open()
        device.close()


def test_checks_option_reaches_the_engine(tmp_path: Path) -> None:
    kernels = KernelBox()
    device = CalsimDriver().open(0, {"time_scale": 0.0, "kernel_factory": kernels, "checks": False})
    gate = Gate()
    try:
        model = device.configure(tmp_path, make_manifest())
        a, b = make_bufs(device, model, DECODE1), make_bufs(device, model, DECODE1)
        kernels.built[0].gate = gate
        first = device.submit(model, decode_spec(a, [(0, 0, 1)]), EngineSlot.PING)
        assert gate.entered.wait(5)
        second = device.submit(model, decode_spec(b, [(1, 0, 1)]), EngineSlot.PING)  # busy bank: accepted
        gate.open()
        assert first.wait(5) is JobStatus.DONE and second.wait(5) is JobStatus.DONE
    finally:
        gate.open()
        device.close()


# ---------------------------------------------------------------- over a device that is not calsim


class UncheckedFakeDevice(FakeDevice):
    """The core tests' `FakeDevice` without the refusals a real runtime does not make: it takes any
    job on any bank, unregisters a held buffer and releases a busy model."""

    def submit(self, model: ConfiguredModel, job: JobSpec, engine_slot: EngineSlot = EngineSlot.AUTO) -> Submission:
        self._alive()
        assert isinstance(model, FakeModel)
        with self._lock:
            sub = FakeSubmission(next(self._jobs), engine_slot, job)
            self.inflight[sub.job_id] = (sub, model)
            return sub

    def unregister_buffer(self, buffer: HostBuffer) -> None:
        with self._lock:
            self.registered.pop(buffer.buffer_id, None)
            self.unregistered.append(buffer.buffer_id)

    def release(self, model: ConfiguredModel) -> None:
        assert isinstance(model, FakeModel)
        model.released = True


@dataclass
class FakeRig:
    guard: GuardedDevice
    fake: UncheckedFakeDevice
    model: FakeModel
    buffers: list[HostBuffer] = field(default_factory=list)

    def job(self, lanes: list[int], *buffers: HostBuffer) -> JobSpec:
        tokens, positions, logits = buffers
        return JobSpec(
            "decode",
            {"tokens": tokens.buffer_id, "positions": positions.buffer_id},
            {"logits": logits.buffer_id},
            tuple(RowSpec(lane, 0, 1) for lane in lanes),
        )

    def bufs(self) -> tuple[HostBuffer, HostBuffer, HostBuffer]:
        made = tuple(self.guard.register_buffer(np.zeros((2, 1), dtype=np.int32)) for _ in range(3))
        return made[0], made[1], made[2]

    def finish(self, sub: Submission) -> None:
        assert isinstance(sub, GuardedSubmission) and isinstance(sub.inner, FakeSubmission)
        self.fake.finish(sub.inner)


def fake_rig(ping_pong: bool) -> FakeRig:
    fake = UncheckedFakeDevice(ping_pong=ping_pong)
    guard = GuardedDevice(fake)
    model = fake.configure_fake({"decode": submodel("decode", TaskType.DECODE, 2, 1, 8)}, 4, 16, 8)
    return FakeRig(guard, fake, model)


def test_guard_over_a_fake_device_refuses_each_daemon_bug() -> None:
    rig = fake_rig(ping_pong=True)
    a, b, c = rig.bufs(), rig.bufs(), rig.bufs()
    first = rig.guard.submit(rig.model, rig.job([0], *a), EngineSlot.PING)
    refusals: list[tuple[JobSpec, EngineSlot, type[DeviceError]]] = [
        (rig.job([1], a[0], b[1], b[2]), EngineSlot.PONG, BufferInUse),
        (rig.job([0], *b), EngineSlot.PONG, LaneBusy),
        (rig.job([1], *b), EngineSlot.PING, EngineBusy),
    ]
    for spec, slot, error in refusals:
        with pytest.raises(error):
            rig.guard.submit(rig.model, spec, slot)
        taken = rig.fake.submit(rig.model, spec, slot)  # the fake underneath takes it
        assert isinstance(taken, FakeSubmission)
        rig.fake.finish(taken)
    second = rig.guard.submit(rig.model, rig.job([1], *b), EngineSlot.PONG)
    with pytest.raises(EngineBusy):
        rig.guard.submit(rig.model, rig.job([2], *c))
    with pytest.raises(BufferInUse):
        rig.guard.unregister_buffer(a[2])
    with pytest.raises(BufferInUse, match="model 'fake' has job"):
        rig.guard.release(rig.model)
    unknown = rig.fake.register_buffer(np.zeros((2, 1), dtype=np.int32))
    with pytest.raises(InvalidJob, match="not registered"):
        rig.guard.submit(rig.model, rig.job([3], c[0], c[1], unknown))
    for sub in (first, second):
        rig.finish(sub)
        assert sub.wait(5) is JobStatus.DONE
    rig.guard.unregister_buffer(a[2])
    rig.guard.release(rig.model)
    with pytest.raises(ModelReleased):
        rig.guard.submit(rig.model, rig.job([2], *c))
    with pytest.raises(ModelReleased):
        rig.guard.release(rig.model)


def test_guard_over_a_one_bank_fake_device_takes_one_job_at_a_time() -> None:
    rig = fake_rig(ping_pong=False)
    a, b = rig.bufs(), rig.bufs()
    first = rig.guard.submit(rig.model, rig.job([0], *a))
    assert first.engine_slot is EngineSlot.AUTO  # the fake names no bank
    with pytest.raises(EngineBusy, match="takes 1 job"):
        rig.guard.submit(rig.model, rig.job([1], *b))
    rig.finish(first)
    with pytest.raises(EngineBusy):  # finished on the device, but nobody has looked yet
        rig.guard.submit(rig.model, rig.job([1], *b))
    assert first.status() is JobStatus.DONE
    assert rig.guard.submit(rig.model, rig.job([1], *b)).engine_slot is EngineSlot.AUTO


def test_configuration_reset_ends_jobs_and_drops_every_model() -> None:
    rig = fake_rig(ping_pong=True)
    other = rig.fake.configure_fake({"decode": submodel("decode", TaskType.DECODE, 2, 1, 8)}, 4, 16, 8)
    a, b = rig.bufs(), rig.bufs()
    rig.guard.submit(rig.model, rig.job([0], *a), EngineSlot.PING)
    rig.guard.submit(other, rig.job([0], *b), EngineSlot.PONG)
    rig.guard.reset_configuration(rig.model)
    assert rig.guard.view().unwaited == frozenset()
    for model in (rig.model, other):  # the contract: every configured model is dropped
        with pytest.raises(ModelReleased):
            rig.guard.submit(model, rig.job([1], *a))
    with pytest.raises(ModelReleased):
        rig.guard.reset_configuration(rig.model)


def test_a_refused_device_submit_holds_nothing() -> None:
    rig = fake_rig(ping_pong=True)
    a = rig.bufs()
    rig.fake.lost = True
    with pytest.raises(DeviceLost):
        rig.guard.submit(rig.model, rig.job([0], *a), EngineSlot.PING)
    view = rig.guard.view()
    assert view.buffers == view.lanes == frozenset()


# ---------------------------------------------------------------- random sequences


OPS = st.one_of(
    st.tuples(
        st.just("submit"),
        st.integers(0, 2),
        st.sets(st.integers(0, LANES - 1), min_size=1, max_size=4),
        st.sampled_from(list(EngineSlot)),
    ),
    st.tuples(st.just("wait"), st.integers(0, 1)),
    st.tuples(st.just("unregister"), st.integers(0, 2)),
    st.tuples(st.just("register"), st.integers(0, 2)),
)


@dataclass
class Running:
    sub: Submission
    bufset: int
    lanes: frozenset[int]


def expected_refusal(
    running: list[Running], registered: list[bool], bufset: int, lanes: set[int], slot: EngineSlot
) -> type[DeviceError] | None:
    if not registered[bufset]:
        return InvalidJob
    if len(running) >= 2 or (slot is not EngineSlot.AUTO and any(r.sub.engine_slot is slot for r in running)):
        return EngineBusy
    if any(r.bufset == bufset for r in running):
        return BufferInUse
    if any(r.lanes & lanes for r in running):
        return LaneBusy
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=25))
def test_random_sequences_keep_the_books_equal_to_the_unfinished_jobs(
    ops: list[tuple[Any, ...]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    guard = GuardedDevice(open_unchecked())
    try:
        model = guard.configure(tmp_path_factory.getbasetemp(), make_manifest())
        assert isinstance(model, CalsimModel)
        sets = [bufs(guard, model, DECODE4) for _ in range(3)]
        registered = [True] * 3
        running: list[Running] = []
        for op in ops:
            if op[0] == "submit":
                _, i, lanes, slot = op
                expected = expected_refusal(running, registered, i, lanes, slot)
                spec = decode_spec(sets[i], [(lane, 0, 1 + lane) for lane in sorted(lanes)])
                if expected is None:
                    running.append(Running(guard.submit(model, spec, slot), i, frozenset(lanes)))
                else:
                    with pytest.raises(expected):
                        guard.submit(model, spec, slot)
            elif op[0] == "wait" and running:
                done = running.pop(op[1] % len(running))
                assert done.sub.wait(5) is JobStatus.DONE
                assert not is_poison(sets[done.bufset].logits.array[: len(done.lanes)])
            elif op[0] == "unregister" and registered[op[1]]:
                held = (sets[op[1]].tokens, sets[op[1]].positions, sets[op[1]].logits)
                if any(r.bufset == op[1] for r in running):
                    with pytest.raises(BufferInUse):
                        guard.unregister_buffer(held[0])
                else:
                    for buf in held:
                        guard.unregister_buffer(buf)
                    registered[op[1]] = False
            elif op[0] == "register" and not registered[op[1]]:
                sets[op[1]] = bufs(guard, model, DECODE4)
                registered[op[1]] = True
            view = guard.view()
            ids = {r.sub.job_id for r in running}
            assert view.unfinished == view.unwaited == ids
            assert view.buffers == {
                b.buffer_id
                for r in running
                for b in (sets[r.bufset].tokens, sets[r.bufset].positions, sets[r.bufset].logits)
            }
            assert view.lanes == {(model.config_id, lane) for r in running for lane in r.lanes}
            assert view.registered == {
                b.buffer_id for i, s in enumerate(sets) if registered[i] for b in (s.tokens, s.positions, s.logits)
            }
        for r in running:
            assert r.sub.wait(5) is JobStatus.DONE
        assert guard.view().buffers == frozenset()
    finally:
        guard.close()


class CounterlessFakeDevice(UncheckedFakeDevice):
    """A runtime that cannot count its jobs."""

    def counters(self) -> JobCounters:
        raise NotImplementedError("this runtime keeps no job counters")


def test_the_guard_synthesises_counters_a_runtime_lacks() -> None:
    fake = CounterlessFakeDevice(ping_pong=True)
    rig = FakeRig(
        GuardedDevice(fake),
        fake,
        fake.configure_fake({"decode": submodel("decode", TaskType.DECODE, 2, 1, 8)}, 4, 16, 8),
    )
    first = rig.guard.submit(rig.model, rig.job([0], *rig.bufs()), EngineSlot.PING)
    second = rig.guard.submit(rig.model, rig.job([1], *rig.bufs()), EngineSlot.PONG)
    assert rig.guard.counters() == JobCounters(submitted=2, pending=0, running=2, finished=0, left=2)
    rig.finish(first)
    assert first.wait(5) is JobStatus.DONE
    assert rig.guard.counters() == JobCounters(submitted=2, pending=0, running=1, finished=1, left=1)
    rig.guard.reset_ccu()
    assert rig.guard.counters() == JobCounters(submitted=2, pending=0, running=0, finished=2, left=0)
    assert second.status() is JobStatus.CCU_EXCEPTION
