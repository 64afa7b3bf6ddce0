"""Read-only views of the daemon for Health, Status, WatchLoad and GetModel (domain form).

Built by `DeviceCore` (`views.py`) from one `EngineSnapshot` plus the device's own facts, with no
lock held; converted to protobuf by `calculet.daemon.wire_views`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from calculet.daemon.core.kv import LaneSnapshot
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.reset_audit import ResetEntry
from calculet.daemon.core.reset_budget import BudgetView
from calculet.daemon.device.types import DeviceInfo, JobCounters, MemoryUsage


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
    reset_history: tuple[ResetEntry, ...] = ()  # the reset audit trail, oldest first


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
