import datetime

from calculet.v1 import common_pb2 as _common_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillOffsetVerdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREFILL_OFFSET_VERDICT_UNSPECIFIED: _ClassVar[PrefillOffsetVerdict]
    PREFILL_OFFSET_VERDICT_PROVEN: _ClassVar[PrefillOffsetVerdict]
    PREFILL_OFFSET_VERDICT_REFUTED: _ClassVar[PrefillOffsetVerdict]
    PREFILL_OFFSET_VERDICT_UNDECLARED: _ClassVar[PrefillOffsetVerdict]

class LaneState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LANE_STATE_UNSPECIFIED: _ClassVar[LaneState]
    LANE_STATE_FREE: _ClassVar[LaneState]
    LANE_STATE_RESERVED: _ClassVar[LaneState]
    LANE_STATE_ACTIVE: _ClassVar[LaneState]
    LANE_STATE_UNKNOWN: _ClassVar[LaneState]
    LANE_STATE_PARKED: _ClassVar[LaneState]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]
    JOB_STATE_PREFILL: _ClassVar[JobState]
    JOB_STATE_DECODE: _ClassVar[JobState]
    JOB_STATE_RECOVERING: _ClassVar[JobState]
    JOB_STATE_FINISHED: _ClassVar[JobState]

class Policy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_UNSPECIFIED: _ClassVar[Policy]
    POLICY_CONTINUOUS: _ClassVar[Policy]
    POLICY_SERIAL: _ClassVar[Policy]
PREFILL_OFFSET_VERDICT_UNSPECIFIED: PrefillOffsetVerdict
PREFILL_OFFSET_VERDICT_PROVEN: PrefillOffsetVerdict
PREFILL_OFFSET_VERDICT_REFUTED: PrefillOffsetVerdict
PREFILL_OFFSET_VERDICT_UNDECLARED: PrefillOffsetVerdict
LANE_STATE_UNSPECIFIED: LaneState
LANE_STATE_FREE: LaneState
LANE_STATE_RESERVED: LaneState
LANE_STATE_ACTIVE: LaneState
LANE_STATE_UNKNOWN: LaneState
LANE_STATE_PARKED: LaneState
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_QUEUED: JobState
JOB_STATE_PREFILL: JobState
JOB_STATE_DECODE: JobState
JOB_STATE_RECOVERING: JobState
JOB_STATE_FINISHED: JobState
POLICY_UNSPECIFIED: Policy
POLICY_CONTINUOUS: Policy
POLICY_SERIAL: Policy

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("status", "device_healthy", "models", "reset_budget", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    RESET_BUDGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.ServingStatus
    device_healthy: bool
    models: _containers.RepeatedCompositeFieldContainer[ModelHealth]
    reset_budget: ResetBudget
    reason: str
    def __init__(self, status: _Optional[_Union[_common_pb2.ServingStatus, str]] = ..., device_healthy: _Optional[bool] = ..., models: _Optional[_Iterable[_Union[ModelHealth, _Mapping]]] = ..., reset_budget: _Optional[_Union[ResetBudget, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class ModelHealth(_message.Message):
    __slots__ = ("alias", "status", "state", "generation")
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    alias: str
    status: _common_pb2.ServingStatus
    state: _common_pb2.ModelState
    generation: int
    def __init__(self, alias: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.ServingStatus, str]] = ..., state: _Optional[_Union[_common_pb2.ModelState, str]] = ..., generation: _Optional[int] = ...) -> None: ...

class ResetBudget(_message.Message):
    __slots__ = ("used", "limit", "window_s", "exhausted")
    USED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    used: int
    limit: int
    window_s: float
    exhausted: bool
    def __init__(self, used: _Optional[int] = ..., limit: _Optional[int] = ..., window_s: _Optional[float] = ..., exhausted: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("board", "device", "models", "jobs", "device_counters", "job_counters", "buffer_pool", "resets", "policy", "max_inflight", "inflight_submissions", "draining", "health", "utilization", "warnings")
    BOARD_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    JOB_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_POOL_FIELD_NUMBER: _ClassVar[int]
    RESETS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_SUBMISSIONS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    board: BoardInfo
    device: DeviceInfo
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    jobs: _containers.RepeatedCompositeFieldContainer[JobSummary]
    device_counters: DeviceJobCounters
    job_counters: JobCounters
    buffer_pool: BufferPoolStatus
    resets: ResetSummary
    policy: Policy
    max_inflight: int
    inflight_submissions: int
    draining: bool
    health: _common_pb2.ServingStatus
    utilization: DeviceUtilization
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, board: _Optional[_Union[BoardInfo, _Mapping]] = ..., device: _Optional[_Union[DeviceInfo, _Mapping]] = ..., models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[JobSummary, _Mapping]]] = ..., device_counters: _Optional[_Union[DeviceJobCounters, _Mapping]] = ..., job_counters: _Optional[_Union[JobCounters, _Mapping]] = ..., buffer_pool: _Optional[_Union[BufferPoolStatus, _Mapping]] = ..., resets: _Optional[_Union[ResetSummary, _Mapping]] = ..., policy: _Optional[_Union[Policy, str]] = ..., max_inflight: _Optional[int] = ..., inflight_submissions: _Optional[int] = ..., draining: _Optional[bool] = ..., health: _Optional[_Union[_common_pb2.ServingStatus, str]] = ..., utilization: _Optional[_Union[DeviceUtilization, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class DeviceUtilization(_message.Message):
    __slots__ = ("device_seconds", "busy_seconds", "busy_ratio", "banks", "h2d_seconds", "compute_seconds", "d2h_seconds", "sampling_seconds", "generated_tokens", "tokens_per_second", "recent_busy_ratio", "recent_window_seconds", "d2h_bytes", "sampled_rows", "full_row_reads", "d2d_seconds", "d2d_bytes")
    DEVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUSY_RATIO_FIELD_NUMBER: _ClassVar[int]
    BANKS_FIELD_NUMBER: _ClassVar[int]
    H2D_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    D2H_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    RECENT_BUSY_RATIO_FIELD_NUMBER: _ClassVar[int]
    RECENT_WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    D2H_BYTES_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_ROWS_FIELD_NUMBER: _ClassVar[int]
    FULL_ROW_READS_FIELD_NUMBER: _ClassVar[int]
    D2D_SECONDS_FIELD_NUMBER: _ClassVar[int]
    D2D_BYTES_FIELD_NUMBER: _ClassVar[int]
    device_seconds: float
    busy_seconds: float
    busy_ratio: float
    banks: _containers.RepeatedCompositeFieldContainer[BankUtilization]
    h2d_seconds: float
    compute_seconds: float
    d2h_seconds: float
    sampling_seconds: float
    generated_tokens: int
    tokens_per_second: float
    recent_busy_ratio: float
    recent_window_seconds: float
    d2h_bytes: int
    sampled_rows: int
    full_row_reads: int
    d2d_seconds: float
    d2d_bytes: int
    def __init__(self, device_seconds: _Optional[float] = ..., busy_seconds: _Optional[float] = ..., busy_ratio: _Optional[float] = ..., banks: _Optional[_Iterable[_Union[BankUtilization, _Mapping]]] = ..., h2d_seconds: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., d2h_seconds: _Optional[float] = ..., sampling_seconds: _Optional[float] = ..., generated_tokens: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., recent_busy_ratio: _Optional[float] = ..., recent_window_seconds: _Optional[float] = ..., d2h_bytes: _Optional[int] = ..., sampled_rows: _Optional[int] = ..., full_row_reads: _Optional[int] = ..., d2d_seconds: _Optional[float] = ..., d2d_bytes: _Optional[int] = ...) -> None: ...

class BankUtilization(_message.Message):
    __slots__ = ("bank", "busy_seconds", "busy_ratio")
    BANK_FIELD_NUMBER: _ClassVar[int]
    BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUSY_RATIO_FIELD_NUMBER: _ClassVar[int]
    bank: int
    busy_seconds: float
    busy_ratio: float
    def __init__(self, bank: _Optional[int] = ..., busy_seconds: _Optional[float] = ..., busy_ratio: _Optional[float] = ...) -> None: ...

class BoardInfo(_message.Message):
    __slots__ = ("name", "index", "daemon_version", "started_at", "driver", "fault_injection")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DAEMON_VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    FAULT_INJECTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    index: int
    daemon_version: str
    started_at: _timestamp_pb2.Timestamp
    driver: str
    fault_injection: bool
    def __init__(self, name: _Optional[str] = ..., index: _Optional[int] = ..., daemon_version: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., driver: _Optional[str] = ..., fault_injection: _Optional[bool] = ...) -> None: ...

class DeviceInfo(_message.Message):
    __slots__ = ("name", "board_index", "chips", "runtime_version", "driver_version", "firmware_version", "capabilities")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BOARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHIPS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    board_index: int
    chips: _containers.RepeatedCompositeFieldContainer[ChipInfo]
    runtime_version: str
    driver_version: str
    firmware_version: str
    capabilities: DeviceCapabilities
    def __init__(self, name: _Optional[str] = ..., board_index: _Optional[int] = ..., chips: _Optional[_Iterable[_Union[ChipInfo, _Mapping]]] = ..., runtime_version: _Optional[str] = ..., driver_version: _Optional[str] = ..., firmware_version: _Optional[str] = ..., capabilities: _Optional[_Union[DeviceCapabilities, _Mapping]] = ...) -> None: ...

class ChipInfo(_message.Message):
    __slots__ = ("index", "dram_total_bytes", "dram_used_bytes", "sram_total_bytes", "sram_used_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DRAM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SRAM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SRAM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    dram_total_bytes: int
    dram_used_bytes: int
    sram_total_bytes: int
    sram_used_bytes: int
    def __init__(self, index: _Optional[int] = ..., dram_total_bytes: _Optional[int] = ..., dram_used_bytes: _Optional[int] = ..., sram_total_bytes: _Optional[int] = ..., sram_used_bytes: _Optional[int] = ...) -> None: ...

class DeviceCapabilities(_message.Message):
    __slots__ = ("max_inflight", "ping_pong", "max_resident_configurations", "lane_selection", "inactive_rows")
    MAX_INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    PING_PONG_FIELD_NUMBER: _ClassVar[int]
    MAX_RESIDENT_CONFIGURATIONS_FIELD_NUMBER: _ClassVar[int]
    LANE_SELECTION_FIELD_NUMBER: _ClassVar[int]
    INACTIVE_ROWS_FIELD_NUMBER: _ClassVar[int]
    max_inflight: int
    ping_pong: bool
    max_resident_configurations: int
    lane_selection: bool
    inactive_rows: str
    def __init__(self, max_inflight: _Optional[int] = ..., ping_pong: _Optional[bool] = ..., max_resident_configurations: _Optional[int] = ..., lane_selection: _Optional[bool] = ..., inactive_rows: _Optional[str] = ...) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("alias", "generation", "state", "package_name", "package_hash", "package_path", "lanes", "queues", "ready_at", "error", "prefix_cache", "prefill_chunk_tokens", "compiler", "calbin_sha256", "memory", "slots", "prefill_offset")
    class CompilerEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_NAME_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_HASH_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_PATH_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    READY_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPILER_FIELD_NUMBER: _ClassVar[int]
    CALBIN_SHA256_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    alias: str
    generation: int
    state: _common_pb2.ModelState
    package_name: str
    package_hash: str
    package_path: str
    lanes: _containers.RepeatedCompositeFieldContainer[LaneStatus]
    queues: QueueDepths
    ready_at: _timestamp_pb2.Timestamp
    error: _common_pb2.ErrorStatus
    prefix_cache: PrefixCacheStatus
    prefill_chunk_tokens: int
    compiler: _containers.ScalarMap[str, str]
    calbin_sha256: str
    memory: _containers.RepeatedCompositeFieldContainer[ModelChipMemory]
    slots: SlotStatus
    prefill_offset: PrefillOffsetStatus
    def __init__(self, alias: _Optional[str] = ..., generation: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.ModelState, str]] = ..., package_name: _Optional[str] = ..., package_hash: _Optional[str] = ..., package_path: _Optional[str] = ..., lanes: _Optional[_Iterable[_Union[LaneStatus, _Mapping]]] = ..., queues: _Optional[_Union[QueueDepths, _Mapping]] = ..., ready_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ..., prefix_cache: _Optional[_Union[PrefixCacheStatus, _Mapping]] = ..., prefill_chunk_tokens: _Optional[int] = ..., compiler: _Optional[_Mapping[str, str]] = ..., calbin_sha256: _Optional[str] = ..., memory: _Optional[_Iterable[_Union[ModelChipMemory, _Mapping]]] = ..., slots: _Optional[_Union[SlotStatus, _Mapping]] = ..., prefill_offset: _Optional[_Union[PrefillOffsetStatus, _Mapping]] = ...) -> None: ...

class ModelChipMemory(_message.Message):
    __slots__ = ("chip", "planned_dram_bytes", "planned_sram_bytes", "dram_bytes", "sram_bytes", "measured")
    CHIP_FIELD_NUMBER: _ClassVar[int]
    PLANNED_DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    PLANNED_SRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    SRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    chip: int
    planned_dram_bytes: int
    planned_sram_bytes: int
    dram_bytes: int
    sram_bytes: int
    measured: bool
    def __init__(self, chip: _Optional[int] = ..., planned_dram_bytes: _Optional[int] = ..., planned_sram_bytes: _Optional[int] = ..., dram_bytes: _Optional[int] = ..., sram_bytes: _Optional[int] = ..., measured: _Optional[bool] = ...) -> None: ...

class SlotStatus(_message.Message):
    __slots__ = ("fixed", "inactive_rows", "active_rows", "compiled_rows", "compactions", "compacted_tokens")
    FIXED_FIELD_NUMBER: _ClassVar[int]
    INACTIVE_ROWS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ROWS_FIELD_NUMBER: _ClassVar[int]
    COMPILED_ROWS_FIELD_NUMBER: _ClassVar[int]
    COMPACTIONS_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    fixed: bool
    inactive_rows: str
    active_rows: int
    compiled_rows: int
    compactions: int
    compacted_tokens: int
    def __init__(self, fixed: _Optional[bool] = ..., inactive_rows: _Optional[str] = ..., active_rows: _Optional[int] = ..., compiled_rows: _Optional[int] = ..., compactions: _Optional[int] = ..., compacted_tokens: _Optional[int] = ...) -> None: ...

class PrefillOffsetStatus(_message.Message):
    __slots__ = ("verdict", "reason", "chunked_prefill", "prefix_reuse", "jump_forward")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHUNKED_PREFILL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_REUSE_FIELD_NUMBER: _ClassVar[int]
    JUMP_FORWARD_FIELD_NUMBER: _ClassVar[int]
    verdict: PrefillOffsetVerdict
    reason: str
    chunked_prefill: bool
    prefix_reuse: bool
    jump_forward: bool
    def __init__(self, verdict: _Optional[_Union[PrefillOffsetVerdict, str]] = ..., reason: _Optional[str] = ..., chunked_prefill: _Optional[bool] = ..., prefix_reuse: _Optional[bool] = ..., jump_forward: _Optional[bool] = ...) -> None: ...

class PrefixCacheStatus(_message.Message):
    __slots__ = ("enabled", "min_tokens", "parked_lanes", "hit_tokens", "miss_tokens", "hits", "misses", "evictions", "dropped")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARKED_LANES_FIELD_NUMBER: _ClassVar[int]
    HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MISS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    min_tokens: int
    parked_lanes: int
    hit_tokens: int
    miss_tokens: int
    hits: int
    misses: int
    evictions: int
    dropped: int
    def __init__(self, enabled: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., parked_lanes: _Optional[int] = ..., hit_tokens: _Optional[int] = ..., miss_tokens: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., evictions: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...

class LaneStatus(_message.Message):
    __slots__ = ("index", "state", "job_id", "kv_length", "parked_s")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KV_LENGTH_FIELD_NUMBER: _ClassVar[int]
    PARKED_S_FIELD_NUMBER: _ClassVar[int]
    index: int
    state: LaneState
    job_id: str
    kv_length: int
    parked_s: float
    def __init__(self, index: _Optional[int] = ..., state: _Optional[_Union[LaneState, str]] = ..., job_id: _Optional[str] = ..., kv_length: _Optional[int] = ..., parked_s: _Optional[float] = ...) -> None: ...

class QueueDepths(_message.Message):
    __slots__ = ("decode_ready", "short_prefill", "long_prefill")
    DECODE_READY_FIELD_NUMBER: _ClassVar[int]
    SHORT_PREFILL_FIELD_NUMBER: _ClassVar[int]
    LONG_PREFILL_FIELD_NUMBER: _ClassVar[int]
    decode_ready: int
    short_prefill: int
    long_prefill: int
    def __init__(self, decode_ready: _Optional[int] = ..., short_prefill: _Optional[int] = ..., long_prefill: _Optional[int] = ...) -> None: ...

class JobSummary(_message.Message):
    __slots__ = ("job_id", "model", "generation", "state", "lane", "prompt_tokens", "completion_tokens", "priority", "age_s", "client_request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model: str
    generation: int
    state: JobState
    lane: int
    prompt_tokens: int
    completion_tokens: int
    priority: int
    age_s: float
    client_request_id: str
    def __init__(self, job_id: _Optional[str] = ..., model: _Optional[str] = ..., generation: _Optional[int] = ..., state: _Optional[_Union[JobState, str]] = ..., lane: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., priority: _Optional[int] = ..., age_s: _Optional[float] = ..., client_request_id: _Optional[str] = ...) -> None: ...

class DeviceJobCounters(_message.Message):
    __slots__ = ("submitted", "pending", "running", "finished", "left")
    SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    submitted: int
    pending: int
    running: int
    finished: int
    left: int
    def __init__(self, submitted: _Optional[int] = ..., pending: _Optional[int] = ..., running: _Optional[int] = ..., finished: _Optional[int] = ..., left: _Optional[int] = ...) -> None: ...

class JobCounters(_message.Message):
    __slots__ = ("accepted", "rejected", "completed", "cancelled", "failed", "recoveries")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    RECOVERIES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    rejected: int
    completed: int
    cancelled: int
    failed: int
    recoveries: int
    def __init__(self, accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., completed: _Optional[int] = ..., cancelled: _Optional[int] = ..., failed: _Optional[int] = ..., recoveries: _Optional[int] = ...) -> None: ...

class BufferPoolStatus(_message.Message):
    __slots__ = ("in_use", "free", "quarantined", "waits")
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    WAITS_FIELD_NUMBER: _ClassVar[int]
    in_use: int
    free: int
    quarantined: int
    waits: int
    def __init__(self, in_use: _Optional[int] = ..., free: _Optional[int] = ..., quarantined: _Optional[int] = ..., waits: _Optional[int] = ...) -> None: ...

class ResetSummary(_message.Message):
    __slots__ = ("count", "last_reason", "last_kind", "last_at", "last_ok", "budget", "history")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_KIND_FIELD_NUMBER: _ClassVar[int]
    LAST_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_OK_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    count: int
    last_reason: str
    last_kind: _common_pb2.ResetKind
    last_at: _timestamp_pb2.Timestamp
    last_ok: bool
    budget: ResetBudget
    history: _containers.RepeatedCompositeFieldContainer[ResetRecord]
    def __init__(self, count: _Optional[int] = ..., last_reason: _Optional[str] = ..., last_kind: _Optional[_Union[_common_pb2.ResetKind, str]] = ..., last_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_ok: _Optional[bool] = ..., budget: _Optional[_Union[ResetBudget, _Mapping]] = ..., history: _Optional[_Iterable[_Union[ResetRecord, _Mapping]]] = ...) -> None: ...

class ResetRecord(_message.Message):
    __slots__ = ("at", "kind", "automatic", "reason", "fault", "inflight_jobs", "recovered", "failed", "generations_before", "generations_after", "health_before", "health_after", "ok", "message")
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AUTOMATIC_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_JOBS_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_AFTER_FIELD_NUMBER: _ClassVar[int]
    HEALTH_BEFORE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_AFTER_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    kind: _common_pb2.ResetKind
    automatic: bool
    reason: str
    fault: str
    inflight_jobs: int
    recovered: int
    failed: int
    generations_before: _containers.RepeatedScalarFieldContainer[str]
    generations_after: _containers.RepeatedScalarFieldContainer[str]
    health_before: _common_pb2.ServingStatus
    health_after: _common_pb2.ServingStatus
    ok: bool
    message: str
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kind: _Optional[_Union[_common_pb2.ResetKind, str]] = ..., automatic: _Optional[bool] = ..., reason: _Optional[str] = ..., fault: _Optional[str] = ..., inflight_jobs: _Optional[int] = ..., recovered: _Optional[int] = ..., failed: _Optional[int] = ..., generations_before: _Optional[_Iterable[str]] = ..., generations_after: _Optional[_Iterable[str]] = ..., health_before: _Optional[_Union[_common_pb2.ServingStatus, str]] = ..., health_after: _Optional[_Union[_common_pb2.ServingStatus, str]] = ..., ok: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class WatchLoadRequest(_message.Message):
    __slots__ = ("interval_ms",)
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    def __init__(self, interval_ms: _Optional[int] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("board", "timestamp", "status", "models", "sequence")
    BOARD_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    board: str
    timestamp: _timestamp_pb2.Timestamp
    status: _common_pb2.ServingStatus
    models: _containers.RepeatedCompositeFieldContainer[ModelLoad]
    sequence: int
    def __init__(self, board: _Optional[str] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., status: _Optional[_Union[_common_pb2.ServingStatus, str]] = ..., models: _Optional[_Iterable[_Union[ModelLoad, _Mapping]]] = ..., sequence: _Optional[int] = ...) -> None: ...

class ModelLoad(_message.Message):
    __slots__ = ("alias", "generation", "state", "ready", "queue_depth", "running", "free_lanes", "lanes_total", "parked_lanes", "pending_prefill_tokens", "prefix", "pending_short_prefill_tokens", "short_prefill_tokens", "queue_limit", "package_hash")
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    FREE_LANES_FIELD_NUMBER: _ClassVar[int]
    LANES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PARKED_LANES_FIELD_NUMBER: _ClassVar[int]
    PENDING_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PENDING_SHORT_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SHORT_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_HASH_FIELD_NUMBER: _ClassVar[int]
    alias: str
    generation: int
    state: _common_pb2.ModelState
    ready: bool
    queue_depth: int
    running: int
    free_lanes: int
    lanes_total: int
    parked_lanes: int
    pending_prefill_tokens: int
    prefix: PrefixBlocks
    pending_short_prefill_tokens: int
    short_prefill_tokens: int
    queue_limit: int
    package_hash: str
    def __init__(self, alias: _Optional[str] = ..., generation: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.ModelState, str]] = ..., ready: _Optional[bool] = ..., queue_depth: _Optional[int] = ..., running: _Optional[int] = ..., free_lanes: _Optional[int] = ..., lanes_total: _Optional[int] = ..., parked_lanes: _Optional[int] = ..., pending_prefill_tokens: _Optional[int] = ..., prefix: _Optional[_Union[PrefixBlocks, _Mapping]] = ..., pending_short_prefill_tokens: _Optional[int] = ..., short_prefill_tokens: _Optional[int] = ..., queue_limit: _Optional[int] = ..., package_hash: _Optional[str] = ...) -> None: ...

class PrefixBlocks(_message.Message):
    __slots__ = ("block_tokens", "hashes", "truncated", "lane_tips")
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    LANE_TIPS_FIELD_NUMBER: _ClassVar[int]
    block_tokens: int
    hashes: _containers.RepeatedScalarFieldContainer[int]
    truncated: bool
    lane_tips: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_tokens: _Optional[int] = ..., hashes: _Optional[_Iterable[int]] = ..., truncated: _Optional[bool] = ..., lane_tips: _Optional[_Iterable[int]] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("alias",)
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    alias: str
    def __init__(self, alias: _Optional[str] = ...) -> None: ...

class GetModelResponse(_message.Message):
    __slots__ = ("model", "tokenizer_json", "chat_template", "tokenizer_size")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_JSON_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_SIZE_FIELD_NUMBER: _ClassVar[int]
    model: ModelSummary
    tokenizer_json: bytes
    chat_template: str
    tokenizer_size: int
    def __init__(self, model: _Optional[_Union[ModelSummary, _Mapping]] = ..., tokenizer_json: _Optional[bytes] = ..., chat_template: _Optional[str] = ..., tokenizer_size: _Optional[int] = ...) -> None: ...

class ModelSummary(_message.Message):
    __slots__ = ("alias", "generation", "state", "package_name", "package_hash", "model_role", "family", "quantization", "vocab_size", "context", "lanes", "eos_token_ids", "bos_token_id", "pad_token_id", "model_max_length", "prefill_fixed_ms", "prefill_ms_per_token", "decode_step_ms", "prefill_chunk_tokens")
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_NAME_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_HASH_FIELD_NUMBER: _ClassVar[int]
    MODEL_ROLE_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PAD_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIXED_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    alias: str
    generation: int
    state: _common_pb2.ModelState
    package_name: str
    package_hash: str
    model_role: str
    family: str
    quantization: str
    vocab_size: int
    context: int
    lanes: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bos_token_id: int
    pad_token_id: int
    model_max_length: int
    prefill_fixed_ms: float
    prefill_ms_per_token: float
    decode_step_ms: float
    prefill_chunk_tokens: int
    def __init__(self, alias: _Optional[str] = ..., generation: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.ModelState, str]] = ..., package_name: _Optional[str] = ..., package_hash: _Optional[str] = ..., model_role: _Optional[str] = ..., family: _Optional[str] = ..., quantization: _Optional[str] = ..., vocab_size: _Optional[int] = ..., context: _Optional[int] = ..., lanes: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., bos_token_id: _Optional[int] = ..., pad_token_id: _Optional[int] = ..., model_max_length: _Optional[int] = ..., prefill_fixed_ms: _Optional[float] = ..., prefill_ms_per_token: _Optional[float] = ..., decode_step_ms: _Optional[float] = ..., prefill_chunk_tokens: _Optional[int] = ...) -> None: ...
