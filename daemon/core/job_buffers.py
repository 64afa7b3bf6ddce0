"""JobContext pool: the host buffers every device job may DMA, allocated and registered once.

docs/daemon.md / docs/sources.md 000 §4. A `JobContext` owns every byte the device may read or write for
one job: one registered `HostBuffer` per input and output tensor of its submodel (`tokens` and
`positions` int32 `[batch, max_tokens]`, `logits` bf16 `[batch, vocab]`). The `JobPool` allocates
`slots_per_key` contexts per `PoolKey` when it is built, registers each buffer with the device once,
and hands contexts out by key; they are never resized, so their addresses stay stable.

Data flow and ownership of one context (state machine below, moves through `Lifecycle`):

    pool.acquire(key, job)   FREE -> PREPARING     the job's builder owns it and fills the inputs
    ctx.mark_submitted()     PREPARING -> SUBMITTED device.submit succeeded: the device owns the buffers
    ctx.mark_running()       SUBMITTED -> RUNNING   the device reported the job running
    ctx.mark_completing()    SUBMITTED|RUNNING -> COMPLETING  wait() returned DONE/CCU_EXCEPTION and
                                                    D2H is done: the completion worker owns it again
    pool.release(ctx)        COMPLETING|PREPARING -> FREE  after postprocessing (or a failed
                                                    validation/submit); buffers are zeroed
    pool.quarantine(ctx)     SUBMITTED|RUNNING -> QUARANTINED  wait timeout or reset: the device may
                                                    still touch the buffers; never handed out again

A cancelled job keeps its context until the device is done with it (cancel only marks "do not
deliver"). Quarantined contexts are dropped (unregistered, RETIRED) by `rebuild(new_epoch)`,
which allocates fresh contexts for the new buffer epoch; a context of an old epoch that is
released later is not reused: `release` sets it aside and the next `sweep` (or rebuild, or close)
unregisters and retires it (epoch fencing). The epoch counts the buffer rebuilds within one model
generation; it is not the model generation. Capacity is a return value: `acquire` returns None when
every slot of the key is busy, never waits.

Locks: `_lock` guards the pool's bookkeeping and its contexts' state moves; it is a leaf lock, held
for bookkeeping only and never across a device call, so `acquire`, `release`, `quarantine` and
`stats` never wait on the device (the engine calls them under its own lock). `_device_lock`
serialises the calls that register or unregister buffers (`rebuild`, `sweep`, `close`); they run
outside `_lock` and outside the engine lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import ml_dtypes
import numpy as np

from calculet.common.errors import FailedPrecondition, InvalidArgument
from calculet.common.lifecycle import Lifecycle, table
from calculet.daemon.core.errors import StaleGeneration
from calculet.daemon.core.ids import DeviceJobId
from calculet.daemon.device.api import HostBuffer, VirtualDevice
from calculet.daemon.device.errors import BufferInUse
from calculet.daemon.device.types import EngineSlot, JobSpec, RowSpec, SubmodelInfo, TaskType, TensorSpec


class BufferState(Enum):
    """Who owns a JobContext's buffers (see the module docstring)."""

    FREE = "free"  # the pool
    PREPARING = "preparing"  # the job builder (host writes inputs)
    SUBMITTED = "submitted"  # the device (DMA may happen any time)
    RUNNING = "running"  # the device
    COMPLETING = "completing"  # the completion worker (D2H done; host reads outputs)
    QUARANTINED = "quarantined"  # nobody may touch it; dropped at the next rebuild or close
    RETIRED = "retired"  # unregistered and dropped from the pool


BUFFER_TRANSITIONS = table(
    [
        (BufferState.FREE, [BufferState.PREPARING, BufferState.RETIRED]),
        (BufferState.PREPARING, [BufferState.SUBMITTED, BufferState.FREE]),
        (BufferState.SUBMITTED, [BufferState.RUNNING, BufferState.COMPLETING, BufferState.QUARANTINED]),
        (BufferState.RUNNING, [BufferState.COMPLETING, BufferState.QUARANTINED]),
        (BufferState.COMPLETING, [BufferState.FREE]),
        (BufferState.QUARANTINED, [BufferState.RETIRED]),
    ]
)

_IN_USE = frozenset({BufferState.PREPARING, BufferState.SUBMITTED, BufferState.RUNNING, BufferState.COMPLETING})

# Manifest dtype names (daemon/package/manifest.py DTYPES) and common aliases -> numpy dtypes.
_DTYPES: dict[str, np.dtype] = {
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "float16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
    "float32": np.dtype(np.float32),
}


def shape_profile(info: SubmodelInfo) -> str:
    """The shape part of a pool key: hardware batch x tokens per row, e.g. "b16x1"."""
    return f"b{info.batch}x{info.max_tokens}"


@dataclass(frozen=True)
class PoolKey:
    """Which contexts are interchangeable: same epoch, submodel, task, engine bank and shapes."""

    epoch: int
    submodel: str
    task_type: TaskType
    engine_slot: EngineSlot
    shape_profile: str

    @classmethod
    def of(cls, epoch: int, info: SubmodelInfo, engine_slot: EngineSlot) -> PoolKey:
        return cls(epoch, info.name, info.task_type, engine_slot, shape_profile(info))


class JobContext:
    """The buffers of one pool slot and the state of the job that holds them.

    Created only by `JobPool`. Attributes `key`, `slot`, `info` and `epoch` never change;
    `owner` is the device job id from `acquire` until `release` (kept while quarantined, for audit).
    Buffers: `inputs` / `outputs` map tensor name -> registered HostBuffer; write inputs only in
    PREPARING and read outputs only in COMPLETING.
    """

    def __init__(
        self,
        key: PoolKey,
        slot: int,
        info: SubmodelInfo,
        inputs: dict[str, HostBuffer],
        outputs: dict[str, HostBuffer],
        lock: threading.Lock,
    ) -> None:
        self.key = key
        self.slot = slot
        self.info = info
        self.epoch = key.epoch
        self.inputs: Mapping[str, HostBuffer] = inputs
        self.outputs: Mapping[str, HostBuffer] = outputs
        self.owner: DeviceJobId | None = None
        self._lock = lock
        self._life: Lifecycle[BufferState] = Lifecycle(
            f"job context {key.submodel}/{key.engine_slot.value}#{slot} epoch {key.epoch}",
            BufferState.FREE,
            BUFFER_TRANSITIONS,
        )
        # Buffers still registered with the device (emptied one by one as they are unregistered).
        self._registered: list[HostBuffer] = [*inputs.values(), *outputs.values()]
        # Byte views for zeroing, [batch, bytes per row] where the first dimension is the batch (a
        # byte fill is ~4x cheaper than an elementwise bf16 fill), else flat.
        self._raw = [_row_bytes(b.array, info.batch) for b in self._registered]
        self._rows_used = 0  # rows a job may have written since the buffers were last zeroed

    @property
    def state(self) -> BufferState:
        return self._life.state

    @property
    def tokens(self) -> np.ndarray:
        """int32 [batch, max_tokens] token ids (input)."""
        return self.inputs["tokens"].array

    @property
    def positions(self) -> np.ndarray:
        """int32 [batch, max_tokens] positions (input)."""
        return self.inputs["positions"].array

    @property
    def logits(self) -> np.ndarray:
        """bf16 [batch, vocab] logits of each row's last token (output)."""
        return self.outputs["logits"].array

    def buffers(self) -> tuple[HostBuffer, ...]:
        """Every buffer of the context, inputs first."""
        return (*self.inputs.values(), *self.outputs.values())

    def job_spec(self, rows: Sequence[RowSpec], tag: str = "", *, fixed_slots: bool = False) -> JobSpec:
        """The submission naming this context's buffers (`fixed_slots`: a slot-bound job of a device
        without lane selection, whose idle slots are masked rows, `device/slots.py`).

        Raises:
            InvalidArgument: no rows, more rows than the hardware batch, or a row feeding 0 (unless
                a masked row of a fixed-slot job) or more than `max_tokens` tokens.
        """
        if not 1 <= len(rows) <= self.info.batch:
            raise InvalidArgument(f"{self.info.name}: {len(rows)} rows, batch holds 1..{self.info.batch}")
        for row in rows:
            if not (fixed_slots and row.is_masked) and not 1 <= row.cur_seq_len <= self.info.max_tokens:
                raise InvalidArgument(
                    f"{self.info.name}: lane {row.lane} feeds {row.cur_seq_len} tokens, "
                    f"submodel takes 1..{self.info.max_tokens}"
                )
        self._rows_used = max(self._rows_used, len(rows))  # before any input is written
        return JobSpec(
            submodel=self.info.name,
            inputs={name: b.buffer_id for name, b in self.inputs.items()},
            outputs={name: b.buffer_id for name, b in self.outputs.items()},
            rows=tuple(rows),
            tag=tag,
        )

    def zero_used_rows(self) -> None:
        """Zero what a job may have written: the rows its spec named, in every buffer with a batch
        dimension (whole buffers otherwise), so no request data survives into the next job.

        Rows past those were zero before the job and stay zero: the executor fills only the spec's
        rows, and the device writes outputs only for a job's active rows (the device contract; calsim
        checks it by poisoning exactly those rows). A decode batch of 16 thus zeroes 16 rows of its
        4.8 MB logits buffer, and a single-row job of it one row, not the whole buffer."""
        used = self._rows_used
        for raw in self._raw:
            (raw[:used] if raw.ndim == 2 else raw).fill(0)
        self._rows_used = 0

    def mark_submitted(self) -> None:
        """`device.submit` accepted the job (PREPARING -> SUBMITTED).

        Raises:
            IllegalTransition: not PREPARING.
        """
        with self._lock:
            self._life.move(BufferState.SUBMITTED)

    def mark_running(self) -> None:
        """The device reported the job running (SUBMITTED -> RUNNING).

        Raises:
            IllegalTransition: not SUBMITTED.
        """
        with self._lock:
            self._life.move(BufferState.RUNNING)

    def mark_completing(self) -> None:
        """`wait` returned a finished status and D2H is done (SUBMITTED|RUNNING -> COMPLETING).

        Raises:
            IllegalTransition: not SUBMITTED or RUNNING.
        """
        with self._lock:
            self._life.move(BufferState.COMPLETING)

    def __repr__(self) -> str:
        return f"JobContext({self._life.name}, {self.state.name}, owner={self.owner})"


@dataclass(frozen=True)
class KeyStats:
    """Contexts of one key of the current epoch."""

    slots: int
    free: int
    in_use: int
    quarantined: int


@dataclass(frozen=True)
class PoolStats:
    """Pool counters for Status and metrics (in_use / quarantined count every epoch).

    Attributes:
        acquire_misses: acquire calls that found no free slot (the "buffer pool waits" metric).
        host_bytes: bytes of every buffer still registered.
    """

    epoch: int
    closed: bool
    in_use: int
    quarantined: int
    acquire_misses: int
    host_bytes: int
    per_key: Mapping[PoolKey, KeyStats]


class PoolState(Enum):
    OPEN = "open"
    CLOSING = "closing"  # close is unregistering buffers: nothing is handed out any more
    CLOSED = "closed"


POOL_TRANSITIONS = table(
    [(PoolState.OPEN, [PoolState.CLOSING]), (PoolState.CLOSING, [PoolState.CLOSED, PoolState.OPEN])]
)


class JobPool:
    """Pool of JobContexts per `PoolKey` for one configured model.

    Args:
        device: the device buffers are registered with.
        submodels: the configured model's submodels (exact names must be unique).
        epoch: the buffer epoch of the first contexts (bumped by each `rebuild`).
        slots_per_key: contexts per (submodel, engine slot).
        engine_slots: engine banks to pool for; (PING, PONG) on a ping/pong device.

    Raises:
        InvalidArgument: no submodels, duplicate names, slots_per_key < 1, empty or repeated
            engine_slots, a tensor with an unknown dtype or a non-positive dimension.
        DeviceError: registering a buffer failed (buffers registered so far are unregistered).
    """

    def __init__(
        self,
        device: VirtualDevice,
        submodels: Iterable[SubmodelInfo],
        epoch: int,
        slots_per_key: int,
        engine_slots: Sequence[EngineSlot] = (EngineSlot.AUTO,),
    ) -> None:
        infos = list(submodels)
        if not infos:
            raise InvalidArgument("job pool needs at least one submodel")
        names = [i.name for i in infos]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"job pool: duplicate submodel names in {names}")
        if slots_per_key < 1:
            raise InvalidArgument(f"job pool slots_per_key must be >= 1, got {slots_per_key}")
        if not engine_slots or len(set(engine_slots)) != len(engine_slots):
            raise InvalidArgument(f"job pool engine_slots must be distinct and non-empty: {engine_slots}")
        for info in infos:
            for spec in (*info.inputs, *info.outputs):
                _check_spec(info, spec)
        self._device = device
        self._infos = infos
        self._engine_slots = tuple(engine_slots)
        self.slots_per_key = slots_per_key
        self._lock = threading.Lock()  # bookkeeping only; never held across a device call
        self._device_lock = threading.Lock()  # one register/unregister pass at a time
        self._retiring: list[JobContext] = []  # old-epoch contexts released, to unregister
        self._life: Lifecycle[PoolState] = Lifecycle("job pool", PoolState.OPEN, POOL_TRANSITIONS)
        self._misses = 0
        self.epoch = epoch
        self._keys: dict[PoolKey, list[JobContext]] = self._build(epoch)
        self._free: dict[PoolKey, deque[JobContext]] = {k: deque(v) for k, v in self._keys.items()}
        self._live: set[JobContext] = {c for ctxs in self._keys.values() for c in ctxs}

    # ---- queries -------------------------------------------------------------------------

    def pool_keys(self) -> tuple[PoolKey, ...]:
        """Keys of the current epoch."""
        with self._lock:
            return tuple(self._keys)

    def key(self, submodel: str, engine_slot: EngineSlot = EngineSlot.AUTO) -> PoolKey:
        """The current epoch's key for a submodel and engine bank.

        Raises:
            InvalidArgument: the pool has no such submodel or engine slot.
        """
        with self._lock:
            for k in self._keys:
                if k.submodel == submodel and k.engine_slot is engine_slot:
                    return k
        raise InvalidArgument(f"job pool has no submodel {submodel!r} on engine slot {engine_slot.value}")

    def in_use(self) -> tuple[JobContext, ...]:
        """Contexts held by a job (PREPARING, SUBMITTED, RUNNING, COMPLETING), any epoch."""
        with self._lock:
            return tuple(c for c in self._live if c.state in _IN_USE)

    def quarantined(self) -> tuple[JobContext, ...]:
        """Contexts in quarantine, any epoch, not yet dropped."""
        with self._lock:
            return tuple(c for c in self._live if c.state is BufferState.QUARANTINED)

    def stats(self) -> PoolStats:
        with self._lock:
            per_key = {
                k: KeyStats(
                    slots=len(ctxs),
                    free=len(self._free[k]),
                    in_use=sum(c.state in _IN_USE for c in ctxs),
                    quarantined=sum(c.state is BufferState.QUARANTINED for c in ctxs),
                )
                for k, ctxs in self._keys.items()
            }
            return PoolStats(
                epoch=self.epoch,
                closed=self._life.state is PoolState.CLOSED,
                in_use=sum(c.state in _IN_USE for c in self._live),
                quarantined=sum(c.state is BufferState.QUARANTINED for c in self._live),
                acquire_misses=self._misses,
                host_bytes=sum(b.nbytes for c in self._live for b in c._registered),
                per_key=per_key,
            )

    # ---- slot transitions ----------------------------------------------------------------

    def acquire(self, key: PoolKey, owner: DeviceJobId) -> JobContext | None:
        """Hand a free context of `key` to job `owner` (FREE -> PREPARING).

        Returns:
            The context, or None when every slot of the key is busy or quarantined.

        Raises:
            FailedPrecondition: the pool is closed.
            StaleGeneration: `key` is of another epoch.
            InvalidArgument: the pool has no such key.
        """
        with self._lock:
            self._check_open()
            if key.epoch != self.epoch:
                raise StaleGeneration(f"job pool is epoch {self.epoch}, key is epoch {key.epoch}")
            free = self._free.get(key)
            if free is None:
                raise InvalidArgument(f"job pool has no key {key}")
            if not free:
                self._misses += 1
                return None
            ctx = free.popleft()
            ctx._life.move(BufferState.PREPARING)
            ctx.owner = owner
            return ctx

    def release(self, ctx: JobContext) -> None:
        """Return a context after its job (COMPLETING or PREPARING -> FREE), zeroing its buffers.
        No device call.

        A context of an older epoch is set aside instead: the next `sweep`, `rebuild` or `close`
        unregisters and retires it.

        Raises:
            InvalidArgument: the context is not a live context of this pool.
            IllegalTransition: it is not COMPLETING or PREPARING (the device may own its buffers).
        """
        with self._lock:
            self._check_live(ctx)
            if not ctx._life.can_move(BufferState.FREE):
                ctx._life.move(BufferState.FREE)  # raises IllegalTransition, nothing touched
            if ctx.epoch != self.epoch:
                ctx._life.move(BufferState.FREE)
                ctx.owner = None
                self._retiring.append(ctx)  # never in a free list again
                return
            ctx.zero_used_rows()
            ctx._life.move(BufferState.FREE)
            ctx.owner = None
            self._free[ctx.key].append(ctx)

    def quarantine(self, ctx: JobContext) -> None:
        """Take a context whose job timed out or was reset out of service (SUBMITTED|RUNNING ->
        QUARANTINED). Its key has one slot fewer until `rebuild`.

        Raises:
            InvalidArgument: the context is not a live context of this pool.
            IllegalTransition: it is not SUBMITTED or RUNNING.
        """
        with self._lock:
            self._check_live(ctx)
            ctx._life.move(BufferState.QUARANTINED)

    # ---- pool transitions ----------------------------------------------------------------

    def rebuild(self, new_epoch: int | None = None) -> None:
        """Switch to buffer epoch `new_epoch` (None: the next one) with freshly allocated and
        registered contexts.

        The new buffers are registered without `_lock`, so acquires and releases of the current
        contexts go on meanwhile; the switch itself is one step under it. Then free and quarantined
        contexts of older epochs are unregistered and retired, except any quarantined one the device
        still holds (`BufferInUse`: a hung job and no reset yet), which stays quarantined and is
        retried at the next rebuild or `close`. Contexts held by a job are retired once released.

        Raises:
            FailedPrecondition: the pool is closed.
            InvalidArgument: `new_epoch` is not greater than the current one.
            DeviceError: registering the new buffers failed (the pool is unchanged) or
                unregistering an old free buffer failed.
        """
        with self._device_lock:
            with self._lock:
                self._check_open()
                if new_epoch is None:
                    new_epoch = self.epoch + 1
                if new_epoch <= self.epoch:
                    raise InvalidArgument(f"job pool rebuild to epoch {new_epoch}, current is {self.epoch}")
            fresh = self._build(new_epoch)  # device calls; nothing else can reach these contexts yet
            with self._lock:
                old = [c for c in self._live if c.state in (BufferState.FREE, BufferState.QUARANTINED)]
                self._retiring.clear()  # free old-epoch contexts: all in `old`
                self.epoch = new_epoch
                self._keys = fresh
                self._free = {k: deque(v) for k, v in fresh.items()}
                self._live.update(c for ctxs in fresh.values() for c in ctxs)
            for ctx in old:  # unreachable now: in no free list, and quarantined ones are never handed out
                try:
                    self._unregister(ctx)
                except BufferInUse:
                    if ctx.state is not BufferState.QUARANTINED:
                        raise
                    continue  # still held by the device: stays quarantined, retried later
                with self._lock:
                    self._retire(ctx)

    def sweep(self) -> None:
        """Unregister and retire the old-epoch contexts released since the last pass (device calls,
        made without `_lock`). On a DeviceError the rest stay set aside for the next pass.

        Raises:
            DeviceError: the device refused to unregister a buffer.
        """
        with self._device_lock:
            with self._lock:
                todo, self._retiring = self._retiring, []
            for n, ctx in enumerate(todo):
                try:
                    self._unregister(ctx)
                except BaseException:
                    with self._lock:
                        self._retiring[:0] = todo[n:]
                    raise
                with self._lock:
                    self._retire(ctx)

    def close(self) -> None:
        """Unregister every buffer and close the pool. Idempotent.

        Raises:
            FailedPrecondition: a context is held by a job (PREPARING..COMPLETING); nothing changes.
            DeviceError: the device refused to unregister a buffer (e.g. a quarantined context of a
                hung job before a reset); the pool stays open and close can be retried.
        """
        with self._device_lock:
            with self._lock:
                if self._life.state is PoolState.CLOSED:
                    return
                busy = [c for c in self._live if c.state in _IN_USE]
                if busy:
                    raise FailedPrecondition(f"job pool close refused: {len(busy)} contexts held by jobs")
                self._life.move(PoolState.CLOSING)  # nothing is handed out while buffers go
                live = list(self._live)
            try:
                for ctx in live:
                    self._unregister(ctx)
                    with self._lock:
                        self._retire(ctx)
            except BaseException:
                with self._lock:
                    self._life.move(PoolState.OPEN)
                raise
            with self._lock:
                self._keys, self._free, self._retiring = {}, {}, []
                self._life.move(PoolState.CLOSED)

    # ---- internals --------------------------------------------------------------------------

    def _build(self, epoch: int) -> dict[PoolKey, list[JobContext]]:
        """Allocate and register every context of an epoch; all or nothing (device calls, no lock)."""
        built: dict[PoolKey, list[JobContext]] = {}
        registered: list[HostBuffer] = []
        try:
            for info in self._infos:
                for engine_slot in self._engine_slots:
                    key = PoolKey.of(epoch, info, engine_slot)
                    ctxs = []
                    for slot in range(self.slots_per_key):
                        inputs = {s.name: self._register(s, registered) for s in info.inputs}
                        outputs = {s.name: self._register(s, registered) for s in info.outputs}
                        ctxs.append(JobContext(key, slot, info, inputs, outputs, self._lock))
                    built[key] = ctxs
        except BaseException:
            for buf in reversed(registered):
                self._device.unregister_buffer(buf)
            raise
        return built

    def _register(self, spec: TensorSpec, registered: list[HostBuffer]) -> HostBuffer:
        buf = self._device.register_buffer(np.zeros(spec.shape, dtype=_DTYPES[spec.dtype]))
        registered.append(buf)
        return buf

    def _unregister(self, ctx: JobContext) -> None:
        """Device calls, without `_lock`: the caller made `ctx` unreachable first."""
        while ctx._registered:
            self._device.unregister_buffer(ctx._registered[-1])
            ctx._registered.pop()

    def _retire(self, ctx: JobContext) -> None:
        """`_lock` held."""
        ctx._life.move(BufferState.RETIRED)
        self._live.discard(ctx)

    def _check_open(self) -> None:
        if self._life.state is not PoolState.OPEN:
            raise FailedPrecondition(f"job pool is {self._life.state.value}")

    def _check_live(self, ctx: JobContext) -> None:
        if ctx not in self._live:
            raise InvalidArgument(f"{ctx!r} is not a live context of this job pool")


def _row_bytes(array: np.ndarray, batch: int) -> np.ndarray:
    """A byte view of a C-contiguous buffer: [batch, bytes per row] when its first dimension is the
    batch, else flat."""
    raw = array.view(np.uint8).reshape(-1)
    if array.ndim >= 2 and array.shape[0] == batch:
        return raw.reshape(batch, -1)
    return raw


def _check_spec(info: SubmodelInfo, spec: TensorSpec) -> None:
    if spec.dtype not in _DTYPES:
        raise InvalidArgument(f"{info.name}.{spec.name}: unsupported dtype {spec.dtype!r}")
    if not spec.shape or any(d < 1 for d in spec.shape):
        raise InvalidArgument(f"{info.name}.{spec.name}: shape {spec.shape} must have positive dimensions")
