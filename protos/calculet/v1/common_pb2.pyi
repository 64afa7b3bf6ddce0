from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_KIND_UNSPECIFIED: _ClassVar[ErrorKind]
    ERROR_KIND_CANCELLED: _ClassVar[ErrorKind]
    ERROR_KIND_INVALID_ARGUMENT: _ClassVar[ErrorKind]
    ERROR_KIND_DEADLINE_EXCEEDED: _ClassVar[ErrorKind]
    ERROR_KIND_NOT_FOUND: _ClassVar[ErrorKind]
    ERROR_KIND_PERMISSION_DENIED: _ClassVar[ErrorKind]
    ERROR_KIND_OVERLOADED: _ClassVar[ErrorKind]
    ERROR_KIND_FAILED_PRECONDITION: _ClassVar[ErrorKind]
    ERROR_KIND_ABORTED: _ClassVar[ErrorKind]
    ERROR_KIND_INTERNAL: _ClassVar[ErrorKind]
    ERROR_KIND_UNAVAILABLE: _ClassVar[ErrorKind]
    ERROR_KIND_UNAUTHENTICATED: _ClassVar[ErrorKind]

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_STATE_UNSPECIFIED: _ClassVar[ModelState]
    MODEL_STATE_UNLOADED: _ClassVar[ModelState]
    MODEL_STATE_VALIDATING: _ClassVar[ModelState]
    MODEL_STATE_CONFIGURING: _ClassVar[ModelState]
    MODEL_STATE_WARMING: _ClassVar[ModelState]
    MODEL_STATE_READY: _ClassVar[ModelState]
    MODEL_STATE_DRAINING: _ClassVar[ModelState]
    MODEL_STATE_UNLOADING: _ClassVar[ModelState]
    MODEL_STATE_FAILED: _ClassVar[ModelState]
    MODEL_STATE_QUARANTINED: _ClassVar[ModelState]

class ServingStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVING_STATUS_UNSPECIFIED: _ClassVar[ServingStatus]
    SERVING_STATUS_SERVING: _ClassVar[ServingStatus]
    SERVING_STATUS_DRAINING: _ClassVar[ServingStatus]
    SERVING_STATUS_NOT_SERVING: _ClassVar[ServingStatus]

class ResetKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESET_KIND_UNSPECIFIED: _ClassVar[ResetKind]
    RESET_KIND_CCU: _ClassVar[ResetKind]
    RESET_KIND_CONFIGURATION: _ClassVar[ResetKind]
    RESET_KIND_DEVICE: _ClassVar[ResetKind]
    RESET_KIND_DRAIN: _ClassVar[ResetKind]
    RESET_KIND_QUARANTINE: _ClassVar[ResetKind]
    RESET_KIND_RESTART: _ClassVar[ResetKind]
    RESET_KIND_UNLOAD: _ClassVar[ResetKind]
    RESET_KIND_SWITCH: _ClassVar[ResetKind]
    RESET_KIND_RESUME: _ClassVar[ResetKind]
ERROR_KIND_UNSPECIFIED: ErrorKind
ERROR_KIND_CANCELLED: ErrorKind
ERROR_KIND_INVALID_ARGUMENT: ErrorKind
ERROR_KIND_DEADLINE_EXCEEDED: ErrorKind
ERROR_KIND_NOT_FOUND: ErrorKind
ERROR_KIND_PERMISSION_DENIED: ErrorKind
ERROR_KIND_OVERLOADED: ErrorKind
ERROR_KIND_FAILED_PRECONDITION: ErrorKind
ERROR_KIND_ABORTED: ErrorKind
ERROR_KIND_INTERNAL: ErrorKind
ERROR_KIND_UNAVAILABLE: ErrorKind
ERROR_KIND_UNAUTHENTICATED: ErrorKind
MODEL_STATE_UNSPECIFIED: ModelState
MODEL_STATE_UNLOADED: ModelState
MODEL_STATE_VALIDATING: ModelState
MODEL_STATE_CONFIGURING: ModelState
MODEL_STATE_WARMING: ModelState
MODEL_STATE_READY: ModelState
MODEL_STATE_DRAINING: ModelState
MODEL_STATE_UNLOADING: ModelState
MODEL_STATE_FAILED: ModelState
MODEL_STATE_QUARANTINED: ModelState
SERVING_STATUS_UNSPECIFIED: ServingStatus
SERVING_STATUS_SERVING: ServingStatus
SERVING_STATUS_DRAINING: ServingStatus
SERVING_STATUS_NOT_SERVING: ServingStatus
RESET_KIND_UNSPECIFIED: ResetKind
RESET_KIND_CCU: ResetKind
RESET_KIND_CONFIGURATION: ResetKind
RESET_KIND_DEVICE: ResetKind
RESET_KIND_DRAIN: ResetKind
RESET_KIND_QUARANTINE: ResetKind
RESET_KIND_RESTART: ResetKind
RESET_KIND_UNLOAD: ResetKind
RESET_KIND_SWITCH: ResetKind
RESET_KIND_RESUME: ResetKind

class ErrorStatus(_message.Message):
    __slots__ = ("kind", "message", "retry_after_s")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    kind: ErrorKind
    message: str
    retry_after_s: float
    def __init__(self, kind: _Optional[_Union[ErrorKind, str]] = ..., message: _Optional[str] = ..., retry_after_s: _Optional[float] = ...) -> None: ...
