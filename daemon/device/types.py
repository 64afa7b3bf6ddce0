"""Value types of the device contract: enums and frozen dataclasses, no behaviour.

Shaped after CalRT 0.7.6 (docs/sources.md 001 §8): a VirtualDevice with chips, configured models
with named submodels, host buffers, jobs submitted to an engine bank (ping/pong), per-job status
and timestamps, job counters, KV lanes and memory usage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class EngineSlot(Enum):
    """Which engine bank (command/buffer bank) a job runs on. AUTO lets the device pick a free one."""

    AUTO = "auto"
    PING = "ping"
    PONG = "pong"


class JobStatus(Enum):
    """Device-side status of a submitted job: PENDING -> RUNNING -> DONE | CCU_EXCEPTION."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    CCU_EXCEPTION = "ccu_exception"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.DONE, JobStatus.CCU_EXCEPTION)


class InactiveRows(Enum):
    """How a job of a device without lane selection names its idle rows (the runtime's KV layouts
    `ONLY_VALID` / `ALL`, docs/sources.md 000 §6.2 step 4, §6.3; `slots.py` checks them).

    ONLY_VALID: rows run from row 0 to the highest active row; an idle row among them is a masked
        row (`RowSpec.masked`), rows past the last one are masked implicitly.
    ALL: the job names every row of its compiled batch, each idle one masked.
    """

    ONLY_VALID = "only_valid"
    ALL = "all"


class TaskType(Enum):
    """A submodel's role. Prefill and decode never share one submission."""

    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class ChipInfo:
    """One chiplet of the board."""

    index: int
    dram_bytes: int
    sram_bytes: int


@dataclass(frozen=True)
class DeviceCapabilities:
    """What the runtime can do, as declared by the device (never inferred from load).

    Attributes:
        max_inflight: jobs that may be in flight at once (1, or 2 with ping/pong banks).
        ping_pong: the device has two engine banks whose copies overlap the other's compute.
        max_resident_configurations: configured models the device can hold at once.
        lane_selection: a job's row may name any KV lane. False: fixed slots, row i of a decode job
            (or of a prefill job of compiled batch > 1) is KV slot i (`slots.py`).
        inactive_rows: with fixed slots, how a job names its idle rows (`InactiveRows`).
        kernel_kinds: the package `kernel` values this driver can configure (the validator refuses
            any other); empty: the driver does not say, and the validator accepts any.
    """

    max_inflight: int
    ping_pong: bool
    max_resident_configurations: int
    lane_selection: bool
    kernel_kinds: tuple[str, ...] = ()
    inactive_rows: InactiveRows = InactiveRows.ONLY_VALID


@dataclass(frozen=True)
class DeviceInfo:
    """Identity and capabilities of an opened VirtualDevice."""

    name: str
    board_index: int
    chips: tuple[ChipInfo, ...]
    runtime_version: str
    driver_version: str
    firmware_version: str
    capabilities: DeviceCapabilities


@dataclass(frozen=True)
class TensorSpec:
    """A named submodel input or output: shape (with batch first) and dtype name (int32, bf16, ...)."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class SubmodelInfo:
    """One executable graph of a configured model.

    Attributes:
        name: exact submodel name from the manifest (never matched by substring).
        task_type: prefill or decode.
        batch: rows per job (hardware batch); rows beyond a job's active rows are masked.
        max_tokens: tokens per row per job (the prefill bucket, 1 for decode).
        inputs / outputs: tensor specs; inputs are `tokens` and `positions` (int32
            `[batch, max_tokens]`), output is `logits` (bf16 `[batch, vocab]`, last token of each row).
    """

    name: str
    task_type: TaskType
    batch: int
    max_tokens: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec:
        return next(t for t in self.inputs if t.name == name)

    def output(self, name: str) -> TensorSpec:
        return next(t for t in self.outputs if t.name == name)


@dataclass(frozen=True)
class RowSpec:
    """One active row of a job: the CSR-like registers for the KV lane it advances.

    Attributes:
        lane: KV lane index this row reads and extends.
        past_kv_len: KV tokens already in the lane before this job (`past_kv_cur_seq_len`).
        cur_seq_len: new tokens this job feeds for this row (`cur_seq_len`); 0 only for a masked
            row of a device without lane selection (`masked`).
    """

    lane: int
    past_kv_len: int
    cur_seq_len: int

    @classmethod
    def masked(cls, slot: int) -> RowSpec:
        """An idle row of a fixed-slot job: it names its slot, reads and writes no KV, and its
        input rows hold zeros (never invented tokens, docs/sources.md 000 §6.2 step 4)."""
        return cls(lane=slot, past_kv_len=0, cur_seq_len=0)

    @property
    def is_masked(self) -> bool:
        return self.cur_seq_len == 0


@dataclass(frozen=True)
class JobSpec:
    """Everything one submission needs. The host buffers stay owned by the submitter until
    the job is finished and waited; the device reads inputs at H2D time and writes outputs
    at D2H time.

    Attributes:
        submodel: exact submodel name.
        inputs / outputs: tensor name -> registered host buffer id.
        rows: the job's rows in order; row i uses row i of every input/output tensor. Rows from
            `len(rows)` to `batch - 1` are masked (never fed tokens); without lane selection a
            masked row among them is `RowSpec.masked` (`slots.py`).
        tag: opaque caller value echoed in traces (the daemon puts its generation/job id here).
    """

    submodel: str
    inputs: dict[str, int]
    outputs: dict[str, int]
    rows: tuple[RowSpec, ...]
    tag: str = ""


@dataclass(frozen=True)
class JobTimestamps:
    """Modelled device times of one job, in seconds on the device clock (not wall clock).

    The device clock starts at 0 when the device is opened and advances by modelled durations
    only, so these values are identical whatever `time_scale` is.

    `d2d_seconds` / `d2d_bytes`: the job's cross-chip (D2D) traffic, the part of its compute phase
    the chips spent on the link and the bytes it moved (docs/package.md `topology.d2d`); 0 when
    the device does not count it or the job was aborted before its compute ended.
    """

    queued: float
    h2d_start: float
    h2d_end: float
    compute_start: float
    compute_end: float
    d2h_start: float
    d2h_end: float
    d2d_seconds: float = 0.0
    d2d_bytes: int = 0

    @property
    def h2d(self) -> float:
        return self.h2d_end - self.h2d_start

    @property
    def compute(self) -> float:
        return self.compute_end - self.compute_start

    @property
    def d2h(self) -> float:
        return self.d2h_end - self.d2h_start


@dataclass(frozen=True)
class JobCounters:
    """Device-wide job counters since open.

    Attributes:
        submitted: jobs accepted by submit.
        pending: accepted but not yet started on the compute unit.
        running: started and not finished (at most one computes; copies may overlap).
        finished: reached DONE or CCU_EXCEPTION.
        left: submitted - finished (pending + running, plus hung jobs).
    """

    submitted: int
    pending: int
    running: int
    finished: int
    left: int


@dataclass(frozen=True)
class ChipMemory:
    """Memory of one chip: bytes in use by configured models and the chip's total."""

    chip: int
    dram_used: int
    dram_total: int
    sram_used: int
    sram_total: int


@dataclass(frozen=True)
class MemoryUsage:
    chips: tuple[ChipMemory, ...] = field(default_factory=tuple)
