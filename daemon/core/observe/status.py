"""Read-only views of the daemon for Health, Status, WatchLoad and GetModel (domain form).

Built by `DeviceCore` (`views.py`) from one `EngineSnapshot` plus the device's own facts, with no
lock held; converted to protobuf by `calculet.daemon.wire_views`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from calculet.daemon.core.audit import AuditEntry
from calculet.daemon.core.kv import LaneSnapshot
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.prefill_offset import OffsetDecision
from calculet.daemon.core.resets.budget import BudgetView
from calculet.daemon.core.unload_check import ChipExcess
from calculet.daemon.device.types import DeviceInfo, EngineSlot, JobCounters, MemoryUsage


@dataclass(frozen=True)
class ModelHealthView:
    alias: str
    generation: int
    state: ModelState


@dataclass(frozen=True)
class HealthView:
    serving: bool
    draining: bool
    device_healthy: bool
    models: tuple[ModelHealthView, ...]
    reset_budget: BudgetView
    reason: str = ""


@dataclass(frozen=True)
class QueueView:
    decode_ready: int
    short_prefill: int
    long_prefill: int


@dataclass(frozen=True)
class PrefixCacheView:
    """Prefix reuse of one generation (observe.proto `PrefixCacheStatus`; `runtime.PrefixStats`)."""

    enabled: bool
    min_tokens: int
    parked_lanes: int
    hit_tokens: int = 0
    miss_tokens: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    dropped: int = 0


@dataclass(frozen=True)
class ModelChipMemoryView:
    """One resident model's memory on one chip (`observe/model_memory.py`): the capacity planner's
    DRAM/SRAM bytes and the device's measured ones (what its configure took; `measured` False when
    the device's figure is not known, e.g. before it is configured)."""

    chip: int
    planned_dram: int
    planned_sram: int
    dram: int
    sram: int
    measured: bool


@dataclass(frozen=True)
class SlotView:
    """Decode rows and fixed slots of one generation (observe.proto `SlotStatus`; `compaction.SlotStats`).

    Attributes:
        fixed: the device has no lane selection: row i of a decode job is slot i (`device/slots.py`).
        inactive_rows: the device's rule for idle rows when `fixed` ("only_valid" / "all"), else "".
        active_rows / compiled_rows: active rows and compiled batch rows of its decode jobs.
        compactions / compacted_tokens: sequences moved to a lower slot by re-prefill, and the
            tokens those re-prefills fed.
    """

    fixed: bool
    inactive_rows: str
    active_rows: int
    compiled_rows: int
    compactions: int
    compacted_tokens: int

    @property
    def fill(self) -> float:
        """Active rows per compiled row (1.0 before any decode job)."""
        return self.active_rows / self.compiled_rows if self.compiled_rows else 1.0


@dataclass(frozen=True)
class ModelView:
    alias: str
    generation: int
    state: ModelState
    published: bool
    ready_at: float | None  # unix time it became Ready
    package_name: str
    package_path: str
    lanes: tuple[LaneSnapshot, ...]
    queues: QueueView
    message: str = ""
    package_hash: str = ""  # SHA-256 of calculet-package.json
    prefix_cache: PrefixCacheView | None = None  # None before the generation is configured
    prefill_chunk_tokens: int = 0
    compiler: tuple[tuple[str, str], ...] = ()  # the manifest's compiler identities
    calbin_sha256: str = ""  # package/identity.py
    memory: tuple[ModelChipMemoryView, ...] = ()  # per chip, planned beside measured
    slots: SlotView | None = None  # None before the generation is configured
    prefill_offset: OffsetDecision | None = None  # None until its load decided it (`prefill_offset.py`)


@dataclass(frozen=True)
class JobView:
    job_id: str
    model: str
    generation: int
    state: str  # SeqState name
    lane: int | None
    prompt_tokens: int
    completion_tokens: int
    priority: int
    age_s: float
    client_request_id: str


@dataclass(frozen=True)
class PoolView:
    in_use: int
    free: int
    quarantined: int
    waits: int


@dataclass(frozen=True)
class ResetOutcome:
    """The most recent reset: its kind ("ccu", "configuration", "device"), when it ended (unix
    time) and whether it succeeded."""

    kind: str
    at: float
    ok: bool


@dataclass(frozen=True)
class BankUtilizationView:
    """One engine bank's compute seconds (device clock) and their share of the device seconds."""

    bank: EngineSlot
    busy_seconds: float
    busy_ratio: float


@dataclass(frozen=True)
class UtilizationView:
    """How busy the device is, from its own job timestamps (`core/utilization.py` defines each figure).

    Attributes:
        device_seconds / busy_seconds / busy_ratio: device-clock span since the first job, the union
            of compute intervals in it, and their ratio.
        banks: the same per engine bank, in bank order.
        h2d_seconds / compute_seconds / d2h_seconds: device-clock phase seconds summed over jobs.
        d2d_seconds / d2d_bytes: of the compute seconds, those on the chip link, and the bytes moved.
        sampling_seconds: host seconds spent sampling; sampled_rows: rows sampled; d2h_bytes: bytes
            copied back for them; full_row_reads: of those rows, top-k rows read in full.
        generated_tokens: tokens generated for client jobs.
        tokens_per_second / recent_busy_ratio: over the last `recent_window_seconds` of wall clock.
    """

    device_seconds: float = 0.0
    busy_seconds: float = 0.0
    busy_ratio: float = 0.0
    banks: tuple[BankUtilizationView, ...] = ()
    h2d_seconds: float = 0.0
    compute_seconds: float = 0.0
    d2h_seconds: float = 0.0
    d2d_seconds: float = 0.0
    d2d_bytes: int = 0
    sampling_seconds: float = 0.0
    generated_tokens: int = 0
    d2h_bytes: int = 0
    sampled_rows: int = 0
    full_row_reads: int = 0
    tokens_per_second: float = 0.0
    recent_busy_ratio: float = 0.0
    recent_window_seconds: float = 0.0


@dataclass(frozen=True)
class StatusView:
    board: int
    driver: str
    started_at: float  # unix time
    fault_injection: bool
    device: DeviceInfo
    memory: MemoryUsage
    models: tuple[ModelView, ...]
    jobs: tuple[JobView, ...]
    device_counters: JobCounters
    accepted: int
    rejected: int
    completed: int
    cancelled: int
    failed: int
    recoveries: int
    pool: PoolView
    resets: int
    last_reset_reason: str
    last_reset: ResetOutcome | None
    policy: str
    max_inflight: int
    inflight: int
    draining: bool
    health: HealthView
    degraded_reason: str = ""
    anomalies: int = 0
    reset_history: tuple[AuditEntry, ...] = ()  # the reset audit trail, oldest first
    utilization: UtilizationView = field(default_factory=UtilizationView)  # device busy ratio, tokens/s
    memory_excess: tuple[ChipExcess, ...] = ()  # per chip, bytes above its baseline when last measured
    warnings: tuple[str, ...] = ()  # what an operator should look at (observe.proto StatusResponse.warnings)


@dataclass(frozen=True)
class ModelLoadView:
    alias: str
    generation: int
    state: ModelState
    ready: bool
    queue_depth: int
    running: int
    free_lanes: int
    lanes_total: int
    parked_lanes: int = 0
    pending_prefill_tokens: int = 0
    prefix_hashes: tuple[int, ...] | None = None  # None: prefix reuse off (nothing advertised)
    prefix_truncated: bool = False
    package_hash: str = ""
    prefix_tips: tuple[int, ...] = ()
    pending_short_prefill_tokens: int = 0
    short_prefill_tokens: int = 0
    queue_limit: int = 0  # requests that may wait for a lane beyond the free ones (0: not reported)


@dataclass(frozen=True)
class LoadView:
    board: str
    serving: bool
    draining: bool
    models: tuple[ModelLoadView, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class ModelInfoView:
    """GetModel: what a gateway needs to serve the model without a shared filesystem."""

    alias: str
    generation: int
    state: ModelState
    package_name: str
    package_hash: str  # SHA-256 of calculet-package.json (which lists every file's hash)
    model_role: str
    family: str
    quantization: str
    vocab_size: int
    context: int
    lanes: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int | None
    model_max_length: int
    tokenizer_json: bytes
    chat_template: str
    prefill_fixed_ms: float = 0.0
    prefill_ms_per_token: float = 0.0
    decode_step_ms: float = 0.0
    prefill_chunk_tokens: int = 0
