from calculet.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FaultKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAULT_KIND_UNSPECIFIED: _ClassVar[FaultKind]
    FAULT_KIND_SUBMIT_ERROR: _ClassVar[FaultKind]
    FAULT_KIND_CCU_EXCEPTION: _ClassVar[FaultKind]
    FAULT_KIND_HANG: _ClassVar[FaultKind]
    FAULT_KIND_NAN_LOGITS: _ClassVar[FaultKind]
    FAULT_KIND_SLOW_JOB: _ClassVar[FaultKind]
    FAULT_KIND_DEVICE_LOST: _ClassVar[FaultKind]
FAULT_KIND_UNSPECIFIED: FaultKind
FAULT_KIND_SUBMIT_ERROR: FaultKind
FAULT_KIND_CCU_EXCEPTION: FaultKind
FAULT_KIND_HANG: FaultKind
FAULT_KIND_NAN_LOGITS: FaultKind
FAULT_KIND_SLOW_JOB: FaultKind
FAULT_KIND_DEVICE_LOST: FaultKind

class LoadRequest(_message.Message):
    __slots__ = ("alias", "package", "options")
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    alias: str
    package: str
    options: LoadOptions
    def __init__(self, alias: _Optional[str] = ..., package: _Optional[str] = ..., options: _Optional[_Union[LoadOptions, _Mapping]] = ...) -> None: ...

class LoadOptions(_message.Message):
    __slots__ = ("replace", "lanes", "drain_timeout_ms", "switch_from", "force", "reason", "requester")
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SWITCH_FROM_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    replace: bool
    lanes: int
    drain_timeout_ms: int
    switch_from: SwitchFrom
    force: bool
    reason: str
    requester: str
    def __init__(self, replace: _Optional[bool] = ..., lanes: _Optional[int] = ..., drain_timeout_ms: _Optional[int] = ..., switch_from: _Optional[_Union[SwitchFrom, _Mapping]] = ..., force: _Optional[bool] = ..., reason: _Optional[str] = ..., requester: _Optional[str] = ...) -> None: ...

class SwitchFrom(_message.Message):
    __slots__ = ("alias", "generation")
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    alias: str
    generation: int
    def __init__(self, alias: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class LoadProgress(_message.Message):
    __slots__ = ("state", "generation", "message", "done", "error", "elapsed_s", "bytes_done", "bytes_total")
    STATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.ModelState
    generation: int
    message: str
    done: bool
    error: _common_pb2.ErrorStatus
    elapsed_s: float
    bytes_done: int
    bytes_total: int
    def __init__(self, state: _Optional[_Union[_common_pb2.ModelState, str]] = ..., generation: _Optional[int] = ..., message: _Optional[str] = ..., done: _Optional[bool] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ..., elapsed_s: _Optional[float] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ...) -> None: ...

class UnloadRequest(_message.Message):
    __slots__ = ("alias", "drain_timeout_ms")
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    alias: str
    drain_timeout_ms: int
    def __init__(self, alias: _Optional[str] = ..., drain_timeout_ms: _Optional[int] = ...) -> None: ...

class UnloadResponse(_message.Message):
    __slots__ = ("generation", "drained_jobs", "interrupted_jobs")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DRAINED_JOBS_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_JOBS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    drained_jobs: int
    interrupted_jobs: int
    def __init__(self, generation: _Optional[int] = ..., drained_jobs: _Optional[int] = ..., interrupted_jobs: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("timeout_ms", "interrupt_remaining")
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_REMAINING_FIELD_NUMBER: _ClassVar[int]
    timeout_ms: int
    interrupt_remaining: bool
    def __init__(self, timeout_ms: _Optional[int] = ..., interrupt_remaining: _Optional[bool] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("drained", "remaining_jobs", "interrupted_jobs")
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_JOBS_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_JOBS_FIELD_NUMBER: _ClassVar[int]
    drained: bool
    remaining_jobs: int
    interrupted_jobs: int
    def __init__(self, drained: _Optional[bool] = ..., remaining_jobs: _Optional[int] = ..., interrupted_jobs: _Optional[int] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("was_draining",)
    WAS_DRAINING_FIELD_NUMBER: _ClassVar[int]
    was_draining: bool
    def __init__(self, was_draining: _Optional[bool] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("kind", "reason", "model")
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    kind: _common_pb2.ResetKind
    reason: str
    model: str
    def __init__(self, kind: _Optional[_Union[_common_pb2.ResetKind, str]] = ..., reason: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class GenerationChange(_message.Message):
    __slots__ = ("alias", "before", "after")
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    alias: str
    before: int
    after: int
    def __init__(self, alias: _Optional[str] = ..., before: _Optional[int] = ..., after: _Optional[int] = ...) -> None: ...

class ResetResult(_message.Message):
    __slots__ = ("ok", "kind", "reason", "health_before", "health_after", "inflight_jobs", "recovered_jobs", "failed_jobs", "generations", "duration_s", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HEALTH_BEFORE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_AFTER_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_JOBS_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_JOBS_FIELD_NUMBER: _ClassVar[int]
    FAILED_JOBS_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    kind: _common_pb2.ResetKind
    reason: str
    health_before: _common_pb2.ServingStatus
    health_after: _common_pb2.ServingStatus
    inflight_jobs: int
    recovered_jobs: int
    failed_jobs: int
    generations: _containers.RepeatedCompositeFieldContainer[GenerationChange]
    duration_s: float
    error: _common_pb2.ErrorStatus
    def __init__(self, ok: _Optional[bool] = ..., kind: _Optional[_Union[_common_pb2.ResetKind, str]] = ..., reason: _Optional[str] = ..., health_before: _Optional[_Union[_common_pb2.ServingStatus, str]] = ..., health_after: _Optional[_Union[_common_pb2.ServingStatus, str]] = ..., inflight_jobs: _Optional[int] = ..., recovered_jobs: _Optional[int] = ..., failed_jobs: _Optional[int] = ..., generations: _Optional[_Iterable[_Union[GenerationChange, _Mapping]]] = ..., duration_s: _Optional[float] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ...) -> None: ...

class FaultSpec(_message.Message):
    __slots__ = ("kind", "job_index", "probability", "seed", "delay_ms")
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    kind: FaultKind
    job_index: int
    probability: float
    seed: int
    delay_ms: int
    def __init__(self, kind: _Optional[_Union[FaultKind, str]] = ..., job_index: _Optional[int] = ..., probability: _Optional[float] = ..., seed: _Optional[int] = ..., delay_ms: _Optional[int] = ...) -> None: ...

class InjectFaultRequest(_message.Message):
    __slots__ = ("fault", "clear_existing")
    FAULT_FIELD_NUMBER: _ClassVar[int]
    CLEAR_EXISTING_FIELD_NUMBER: _ClassVar[int]
    fault: FaultSpec
    clear_existing: bool
    def __init__(self, fault: _Optional[_Union[FaultSpec, _Mapping]] = ..., clear_existing: _Optional[bool] = ...) -> None: ...

class InjectFaultResponse(_message.Message):
    __slots__ = ("next_job_index", "planned_faults")
    NEXT_JOB_INDEX_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FAULTS_FIELD_NUMBER: _ClassVar[int]
    next_job_index: int
    planned_faults: int
    def __init__(self, next_job_index: _Optional[int] = ..., planned_faults: _Optional[int] = ...) -> None: ...
