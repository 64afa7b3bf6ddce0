"""JobPool / JobContext: buffer ownership, the state table, quarantine, rebuild and close."""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from calculet.common.errors import FailedPrecondition, IllegalTransition, InvalidArgument
from calculet.daemon.core.errors import StaleGeneration
from calculet.daemon.core.job_buffers import BufferState, JobContext, JobPool, PoolKey, shape_profile
from calculet.daemon.device.api import HostBuffer
from calculet.daemon.device.errors import BufferInUse, DeviceLost
from calculet.daemon.device.types import EngineSlot, JobStatus, RowSpec, SubmodelInfo, TaskType, TensorSpec

from .fakes import FakeDevice, FakeModel, submodel

VOCAB = 32
PREFILL = submodel("prefill_b1_t8", TaskType.PREFILL, batch=1, max_tokens=8, vocab=VOCAB)
DECODE = submodel("decode_b4", TaskType.DECODE, batch=4, max_tokens=1, vocab=VOCAB)


def make_pool(
    slots: int = 2,
    epoch: int = 1,
    device: FakeDevice | None = None,
    engine_slots: tuple[EngineSlot, ...] = (EngineSlot.AUTO,),
) -> tuple[JobPool, FakeDevice]:
    dev = device or FakeDevice()
    return JobPool(dev, [PREFILL, DECODE], epoch, slots, engine_slots), dev


def decode_key(pool: JobPool, slot: EngineSlot = EngineSlot.AUTO) -> PoolKey:
    return pool.key(DECODE.name, slot)


def acquired(pool: JobPool, owner: int = 1, slot: EngineSlot = EngineSlot.AUTO) -> JobContext:
    ctx = pool.acquire(decode_key(pool, slot), owner)
    assert ctx is not None
    return ctx


def model_for(dev: FakeDevice) -> FakeModel:
    return dev.configure_fake({PREFILL.name: PREFILL, DECODE.name: DECODE}, lanes=4, lane_context=64, vocab=VOCAB)


# ---- allocation and registration ---------------------------------------------------------


def test_buffers_have_contract_shapes_and_dtypes() -> None:
    pool, _ = make_pool(slots=1)
    ctx = acquired(pool)
    assert ctx.tokens.shape == ctx.positions.shape == (DECODE.batch, DECODE.max_tokens)
    assert ctx.tokens.dtype == np.int32 and ctx.positions.dtype == np.int32
    assert ctx.logits.shape == (DECODE.batch, VOCAB) and ctx.logits.dtype == ml_dtypes.bfloat16
    assert all(b.array.flags.c_contiguous for b in ctx.buffers())
    pre = pool.acquire(pool.key(PREFILL.name), 2)
    assert pre is not None and pre.tokens.shape == (1, 8)


def test_keys_cover_submodels_times_engine_slots() -> None:
    pool, _ = make_pool(slots=1, epoch=3, engine_slots=(EngineSlot.PING, EngineSlot.PONG))
    keys = set(pool.pool_keys())
    assert keys == {
        PoolKey(3, info.name, info.task_type, slot, shape_profile(info))
        for info in (PREFILL, DECODE)
        for slot in (EngineSlot.PING, EngineSlot.PONG)
    }
    assert shape_profile(DECODE) != shape_profile(PREFILL)


def test_each_buffer_registered_exactly_once_and_distinct() -> None:
    pool, dev = make_pool(slots=3, engine_slots=(EngineSlot.PING, EngineSlot.PONG))
    ctxs = []
    for key in pool.pool_keys():
        while (ctx := pool.acquire(key, 1)) is not None:
            ctxs.append(ctx)
    assert len(ctxs) == 2 * 2 * 3  # submodels x engine slots x slots
    buffers = [b for c in ctxs for b in c.buffers()]
    assert len(buffers) == 3 * len(ctxs)
    assert {b.buffer_id for b in buffers} == set(dev.registered)
    assert all(dev.array_registrations[id(b.array)] == 1 for b in buffers)
    for i, a in enumerate(buffers):
        for b in buffers[i + 1 :]:
            assert not np.shares_memory(a.array, b.array)
    # Reuse does not register again.
    for ctx in ctxs:
        pool.release(ctx)
    acquired(pool, slot=EngineSlot.PING)
    assert len(dev.registered) == len(buffers) and not dev.unregistered


def test_register_failure_unregisters_what_was_registered() -> None:
    dev = FakeDevice(fail_register_after=5)
    with pytest.raises(DeviceLost):
        JobPool(dev, [PREFILL, DECODE], 1, 2)
    assert dev.registered == {}
    assert len(dev.unregistered) == 5


# ---- acquire / release -------------------------------------------------------------------


def test_acquire_returns_none_when_all_slots_busy() -> None:
    pool, _ = make_pool(slots=2)
    key = decode_key(pool)
    a, b = pool.acquire(key, 1), pool.acquire(key, 2)
    assert a is not None and b is not None and a is not b
    assert (a.owner, b.owner) == (1, 2)
    assert pool.acquire(key, 3) is None
    assert pool.stats().acquire_misses == 1
    assert pool.acquire(pool.key(PREFILL.name), 4) is not None  # other keys are independent
    pool.release(a)
    again = pool.acquire(key, 5)
    assert again is a and again.owner == 5


@pytest.mark.parametrize("rows", [1, 2, DECODE.batch])
def test_release_clears_request_data_of_every_row_the_job_named(rows: int) -> None:
    pool, _ = make_pool(slots=1)
    ctx = acquired(pool)
    ctx.job_spec([RowSpec(lane, 3, 1) for lane in range(rows)])
    ctx.tokens[:rows] = 7  # the executor fills the spec's rows
    ctx.positions[:rows] = 9
    ctx.mark_submitted()
    ctx.logits[:rows] = 1.5  # the device wrote the active rows' outputs
    ctx.mark_completing()
    pool.release(ctx)
    assert ctx.state is BufferState.FREE and ctx.owner is None
    assert not ctx.tokens.any() and not ctx.positions.any() and not ctx.logits.astype(np.float32).any()
    again = acquired(pool)  # the next job of the context starts from zeroed buffers too
    again.job_spec([RowSpec(0, 0, 1)])
    again.tokens[0] = 5
    again.mark_submitted()
    again.mark_completing()
    pool.release(again)
    assert not again.tokens.any()


def test_release_zeroes_only_the_rows_a_job_could_have_written() -> None:
    # Rows past the spec's were zero before the job and nothing writes them: they are not touched
    # (a marker there survives), which is what keeps a one-row job from zeroing a 16-row buffer.
    pool, _ = make_pool(slots=1)
    ctx = acquired(pool)
    ctx.job_spec([RowSpec(0, 3, 1)])
    ctx.tokens[:2] = 7
    ctx.mark_submitted()
    ctx.mark_completing()
    pool.release(ctx)
    assert not ctx.tokens[0].any() and (ctx.tokens[1] == 7).all()


def test_full_cycle_through_the_fake_device() -> None:
    pool, dev = make_pool(slots=1)
    model = model_for(dev)
    ctx = acquired(pool, owner=11)
    ctx.tokens[:, 0] = [1, 2, 3, 4]
    spec = ctx.job_spec([RowSpec(lane=i, past_kv_len=0, cur_seq_len=1) for i in range(2)], tag="g1/j11")
    assert spec.submodel == DECODE.name and spec.inputs["tokens"] == ctx.inputs["tokens"].buffer_id
    sub = dev.submit(model, spec)
    ctx.mark_submitted()
    with pytest.raises(FailedPrecondition):  # the device holds the buffers: close must refuse
        pool.close()
    ctx.mark_running()
    dev.finish(sub)  # type: ignore[arg-type]
    assert sub.wait(timeout=5) is JobStatus.DONE
    ctx.mark_completing()
    pool.release(ctx)
    pool.close()
    assert dev.registered == {}


@pytest.mark.parametrize(
    ("rows", "error"),
    [
        ([], InvalidArgument),
        ([RowSpec(i, 0, 1) for i in range(5)], InvalidArgument),  # batch is 4
        ([RowSpec(0, 0, 2)], InvalidArgument),  # decode takes 1 token per row
        ([RowSpec(0, 0, 0)], InvalidArgument),
    ],
)
def test_job_spec_rejects_rows_that_do_not_fit(rows: list[RowSpec], error: type[Exception]) -> None:
    pool, _ = make_pool()
    with pytest.raises(error):
        acquired(pool).job_spec(rows)


# ---- the state table ---------------------------------------------------------------------

# The edges from the brief (docs/sources.md 000 §4.2), written out independently of BUFFER_TRANSITIONS.
LEGAL = {
    BufferState.PREPARING: {"mark_submitted", "release"},
    BufferState.SUBMITTED: {"mark_running", "mark_completing", "quarantine"},
    BufferState.RUNNING: {"mark_completing", "quarantine"},
    BufferState.COMPLETING: {"release"},
    BufferState.QUARANTINED: set(),
    BufferState.FREE: set(),
}
OPS = ["mark_submitted", "mark_running", "mark_completing", "release", "quarantine"]
PATHS: dict[BufferState, list[str]] = {
    BufferState.PREPARING: [],
    BufferState.SUBMITTED: ["mark_submitted"],
    BufferState.RUNNING: ["mark_submitted", "mark_running"],
    BufferState.COMPLETING: ["mark_submitted", "mark_completing"],
    BufferState.QUARANTINED: ["mark_submitted", "quarantine"],
    BufferState.FREE: ["release"],
}


def apply(pool: JobPool, ctx: JobContext, op: str) -> None:
    calls: dict[str, Callable[[], None]] = {
        "mark_submitted": ctx.mark_submitted,
        "mark_running": ctx.mark_running,
        "mark_completing": ctx.mark_completing,
        "release": lambda: pool.release(ctx),
        "quarantine": lambda: pool.quarantine(ctx),
    }
    calls[op]()


@pytest.mark.parametrize("state", list(PATHS))
@pytest.mark.parametrize("op", OPS)
def test_every_illegal_transition_raises(state: BufferState, op: str) -> None:
    pool, _ = make_pool(slots=1)
    ctx = acquired(pool)
    for step in PATHS[state]:
        apply(pool, ctx, step)
    assert ctx.state is state
    if op in LEGAL[state]:
        apply(pool, ctx, op)
        assert ctx.state is not state
    else:
        ctx.tokens[:] = 3  # must survive a refused release (the device may own the buffer)
        with pytest.raises(IllegalTransition):
            apply(pool, ctx, op)
        assert ctx.state is state
        if state is not BufferState.FREE:
            assert (ctx.tokens == 3).all()


def test_submitted_to_completing_fast_path() -> None:
    pool, _ = make_pool(slots=1)
    ctx = acquired(pool)
    ctx.mark_submitted()
    ctx.mark_completing()
    pool.release(ctx)
    assert acquired(pool) is ctx


def test_failed_submit_returns_context_from_preparing() -> None:
    pool, _ = make_pool(slots=1)
    ctx = acquired(pool)
    pool.release(ctx)
    assert acquired(pool) is ctx


# ---- quarantine and rebuild --------------------------------------------------------------


def test_quarantined_context_never_comes_back() -> None:
    pool, _ = make_pool(slots=2)
    key = decode_key(pool)
    bad = acquired(pool)
    bad.mark_submitted()
    pool.quarantine(bad)
    handed: list[JobContext] = []
    for i in range(10):  # churn the key: the quarantined slot is never handed out
        ctx = pool.acquire(key, i)
        assert ctx is not None and ctx is not bad
        handed.append(ctx)
        assert pool.acquire(key, 99) is None  # only one good slot left
        pool.release(ctx)
    assert pool.quarantined() == (bad,)
    assert pool.stats().per_key[key].quarantined == 1
    with pytest.raises(IllegalTransition):
        pool.release(bad)


def test_rebuild_gives_fresh_buffers_and_drops_old_ones() -> None:
    pool, dev = make_pool(slots=1, epoch=1)
    old = acquired(pool)
    old.mark_submitted()
    pool.quarantine(old)
    old_free = pool.acquire(pool.key(PREFILL.name), 2)
    assert old_free is not None
    pool.release(old_free)
    old_ids = {b.buffer_id for b in (*old.buffers(), *old_free.buffers())}

    pool.rebuild(2)

    assert pool.epoch == 2 and all(k.epoch == 2 for k in pool.pool_keys())
    assert old.state is BufferState.RETIRED and old_free.state is BufferState.RETIRED
    assert pool.quarantined() == ()
    assert old_ids <= set(dev.unregistered) and not old_ids & set(dev.registered)
    new = acquired(pool)
    assert new is not old and new.epoch == 2
    new_ids = {b.buffer_id for b in new.buffers()}
    assert not new_ids & old_ids
    for b in new.buffers():
        for o in old.buffers():
            assert not np.shares_memory(b.array, o.array)
    with pytest.raises(StaleGeneration):
        pool.acquire(old.key, 3)


class LockCheckingDevice(FakeDevice):
    """Fails a buffer (un)registration made while the pool's bookkeeping lock is held: the engine calls
    acquire/release under its own lock, so a device call under the pool's would stall the engine."""

    pool: JobPool | None = None

    def register_buffer(self, array: np.ndarray) -> HostBuffer:
        assert self.pool is None or not self.pool._lock.locked(), "register_buffer under the pool lock"
        return super().register_buffer(array)

    def unregister_buffer(self, buffer: HostBuffer) -> None:
        assert self.pool is None or not self.pool._lock.locked(), "unregister_buffer under the pool lock"
        super().unregister_buffer(buffer)


def test_no_device_call_happens_under_the_pool_lock() -> None:
    dev = LockCheckingDevice()
    pool, _ = make_pool(slots=1, device=dev)
    dev.pool = pool
    ctx = acquired(pool)
    ctx.mark_submitted()
    pool.rebuild(2)  # registers the new epoch, unregisters the old free contexts
    ctx.mark_completing()
    pool.release(ctx)
    pool.sweep()  # unregisters the old-epoch context released after the rebuild
    assert ctx.state is BufferState.RETIRED
    pool.close()
    assert pool.stats().closed


def test_old_epoch_context_released_after_rebuild_is_dropped() -> None:
    pool, dev = make_pool(slots=1, epoch=1)
    ctx = acquired(pool)
    ctx.mark_submitted()
    pool.rebuild(2)
    assert ctx.state is BufferState.SUBMITTED and ctx in pool.in_use()
    ctx.mark_completing()
    pool.release(ctx)  # no device call: set aside for the next sweep
    assert ctx.state is BufferState.FREE and not any(b.buffer_id in dev.unregistered for b in ctx.buffers())
    assert ctx not in pool.in_use()
    pool.sweep()
    assert ctx.state is BufferState.RETIRED
    assert all(b.buffer_id in dev.unregistered for b in ctx.buffers())
    key = decode_key(pool)
    assert pool.acquire(key, 1) is not None and pool.acquire(key, 2) is None  # still 1 slot
    with pytest.raises(InvalidArgument):  # retired: no longer a context of the pool
        pool.release(ctx)


def test_rebuild_keeps_a_quarantined_context_the_device_still_holds() -> None:
    pool, dev = make_pool(slots=1)
    ctx = acquired(pool)
    ctx.mark_submitted()
    pool.quarantine(ctx)
    held = ctx.inputs["tokens"].buffer_id
    dev.held.add(held)  # a hung job, no reset yet
    pool.rebuild(2)
    assert pool.quarantined() == (ctx,)
    assert held in dev.registered
    with pytest.raises(BufferInUse):
        pool.close()
    dev.held.discard(held)  # the device was reset
    pool.close()
    assert dev.registered == {} and ctx.state is BufferState.RETIRED


def test_rebuild_failure_leaves_pool_unchanged() -> None:
    dev = FakeDevice()
    pool, _ = make_pool(slots=1, device=dev)
    before = set(dev.registered)
    dev.fail_register_after = len(dev.registered) + 2
    with pytest.raises(DeviceLost):
        pool.rebuild(2)
    assert pool.epoch == 1 and set(dev.registered) == before
    assert acquired(pool).epoch == 1


@pytest.mark.parametrize("epoch", [1, 0, -4])
def test_rebuild_must_move_epoch_forward(epoch: int) -> None:
    pool, _ = make_pool(epoch=1)
    with pytest.raises(InvalidArgument):
        pool.rebuild(epoch)
    assert pool.epoch == 1


# ---- close -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [[], ["mark_submitted"], ["mark_submitted", "mark_running"]])
def test_close_refuses_while_a_job_holds_a_context(path: list[str]) -> None:
    pool, dev = make_pool()
    ctx = acquired(pool)
    for step in path:
        apply(pool, ctx, step)
    registered = set(dev.registered)
    with pytest.raises(FailedPrecondition):
        pool.close()
    assert set(dev.registered) == registered and not pool.stats().closed


def test_close_unregisters_everything_and_is_idempotent() -> None:
    pool, dev = make_pool(slots=2, engine_slots=(EngineSlot.PING, EngineSlot.PONG))
    all_ids = set(dev.registered)
    q = acquired(pool, slot=EngineSlot.PONG)
    q.mark_submitted()
    pool.quarantine(q)
    pool.close()
    pool.close()
    assert dev.registered == {} and set(dev.unregistered) == all_ids
    assert len(dev.unregistered) == len(all_ids)  # each exactly once
    assert pool.stats().closed and pool.stats().host_bytes == 0
    with pytest.raises(FailedPrecondition):
        pool.acquire(PoolKey(1, DECODE.name, TaskType.DECODE, EngineSlot.PING, shape_profile(DECODE)), 1)
    with pytest.raises(FailedPrecondition):
        pool.rebuild(2)


# ---- bad inputs --------------------------------------------------------------------------


def _bad_dtype() -> SubmodelInfo:
    return SubmodelInfo("x", TaskType.DECODE, 1, 1, (TensorSpec("tokens", (1, 1), "int4"),), ())


def _bad_shape() -> SubmodelInfo:
    return SubmodelInfo("x", TaskType.DECODE, 1, 1, (TensorSpec("tokens", (1, 0), "int32"),), ())


@pytest.mark.parametrize(
    ("submodels", "slots", "engine_slots"),
    [
        ([], 1, (EngineSlot.AUTO,)),
        ([DECODE, DECODE], 1, (EngineSlot.AUTO,)),
        ([DECODE], 0, (EngineSlot.AUTO,)),
        ([DECODE], 1, ()),
        ([DECODE], 1, (EngineSlot.PING, EngineSlot.PING)),
        ([_bad_dtype()], 1, (EngineSlot.AUTO,)),
        ([_bad_shape()], 1, (EngineSlot.AUTO,)),
    ],
)
def test_bad_pool_configuration_is_invalid_argument_and_registers_nothing(
    submodels: list[SubmodelInfo], slots: int, engine_slots: tuple[EngineSlot, ...]
) -> None:
    dev = FakeDevice()
    with pytest.raises(InvalidArgument):
        JobPool(dev, submodels, 1, slots, engine_slots)
    assert dev.registered == {} and not dev.array_registrations


def test_unknown_key_and_foreign_context_are_invalid_argument() -> None:
    pool, _ = make_pool()
    other, _ = make_pool()
    with pytest.raises(InvalidArgument):
        pool.key("nope")
    with pytest.raises(InvalidArgument):
        pool.key(DECODE.name, EngineSlot.PING)
    with pytest.raises(InvalidArgument):
        pool.acquire(PoolKey(1, "nope", TaskType.DECODE, EngineSlot.AUTO, "b1x1"), 1)
    foreign = acquired(other)
    with pytest.raises(InvalidArgument):
        pool.release(foreign)
    with pytest.raises(InvalidArgument):
        pool.quarantine(foreign)
    assert foreign.state is BufferState.PREPARING


def test_key_of_another_epoch_is_stale() -> None:
    pool, _ = make_pool(epoch=4)
    key = decode_key(pool)
    with pytest.raises(StaleGeneration):
        pool.acquire(PoolKey(3, key.submodel, key.task_type, key.engine_slot, key.shape_profile), 1)


# ---- stateful: never handed out twice ----------------------------------------------------


class PoolMachine(RuleBasedStateMachine):
    """Random acquire / state moves / release / quarantine / rebuild. Tracks which contexts the
    test holds; a context handed out while held, or a quarantined/retired one handed out, fails."""

    def __init__(self) -> None:
        super().__init__()
        self.dev = FakeDevice()
        self.pool = JobPool(self.dev, [DECODE], 1, 2, (EngineSlot.PING, EngineSlot.PONG))
        self.held: list[JobContext] = []
        # Contexts quarantined or retired, kept alive so a new object cannot reuse their id().
        self.banned: list[JobContext] = []
        self.owners = 0

    @rule(slot=st.sampled_from([EngineSlot.PING, EngineSlot.PONG]), rows=st.integers(1, DECODE.batch))
    def acquire(self, slot: EngineSlot, rows: int) -> None:
        self.owners += 1
        ctx = self.pool.acquire(self.pool.key(DECODE.name, slot), self.owners)
        if ctx is None:
            return
        assert all(ctx is not h for h in self.held), "handed out twice"
        assert all(ctx is not b for b in self.banned), "a quarantined or retired context came back"
        assert ctx.state is BufferState.PREPARING and ctx.epoch == self.pool.epoch
        assert not ctx.tokens.any()
        ctx.job_spec([RowSpec(lane, 0, 1) for lane in range(rows)])
        ctx.tokens[:rows] = self.owners  # request data that must not leak to the next owner
        self.held.append(ctx)

    @rule(data=st.data(), op=st.sampled_from(OPS))
    def move(self, data: st.DataObject, op: str) -> None:
        if not self.held:
            return
        ctx = data.draw(st.sampled_from(self.held))
        before = ctx.state
        legal = op in LEGAL[before]
        if not legal:
            with pytest.raises(IllegalTransition):
                apply(self.pool, ctx, op)
            return
        apply(self.pool, ctx, op)
        if op == "release":
            self.held.remove(ctx)
            if ctx.state is BufferState.RETIRED:
                self.banned.append(ctx)
        elif op == "quarantine":
            self.held.remove(ctx)
            self.banned.append(ctx)

    @rule()
    def rebuild(self) -> None:
        self.pool.rebuild(self.pool.epoch + 1)

    @invariant()
    def counts_match(self) -> None:
        in_use = self.pool.in_use()
        assert {id(c) for c in in_use} == {id(c) for c in self.held}
        for k, s in self.pool.stats().per_key.items():
            assert s.free + s.in_use + s.quarantined == s.slots == 2
            assert k.epoch == self.pool.epoch
        registered = set(self.dev.registered)
        for c in (*in_use, *self.pool.quarantined()):
            assert {b.buffer_id for b in c.buffers()} <= registered

    def teardown(self) -> None:
        for ctx in list(self.held):
            if ctx.state in (BufferState.SUBMITTED, BufferState.RUNNING):
                ctx.mark_completing()
            self.pool.release(ctx)
        self.pool.close()
        assert self.dev.registered == {}


PoolMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
TestPoolMachine = PoolMachine.TestCase
