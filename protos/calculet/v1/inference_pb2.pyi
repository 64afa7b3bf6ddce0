from calculet.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_ERROR: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("seed", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "logprobs", "return_logits", "constraint", "thinking")
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOGITS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    THINKING_FIELD_NUMBER: _ClassVar[int]
    seed: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    logprobs: int
    return_logits: bool
    constraint: Constraint
    thinking: ThinkingBudget
    def __init__(self, seed: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logprobs: _Optional[int] = ..., return_logits: _Optional[bool] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ..., thinking: _Optional[_Union[ThinkingBudget, _Mapping]] = ...) -> None: ...

class ThinkingBudget(_message.Message):
    __slots__ = ("budget", "open_token_id", "close_token_id")
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    OPEN_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    CLOSE_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    budget: int
    open_token_id: int
    close_token_id: int
    def __init__(self, budget: _Optional[int] = ..., open_token_id: _Optional[int] = ..., close_token_id: _Optional[int] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "choice", "lark")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    LARK_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    choice: ConstraintChoice
    lark: str
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[ConstraintChoice, _Mapping]] = ..., lark: _Optional[str] = ...) -> None: ...

class ConstraintChoice(_message.Message):
    __slots__ = ("options",)
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, options: _Optional[_Iterable[str]] = ...) -> None: ...

class StoppingParams(_message.Message):
    __slots__ = ("max_tokens", "stop_token_ids", "ignore_eos")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    def __init__(self, max_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("model", "client_request_id", "prompt_tokens", "resume_tokens", "sampling", "stopping", "priority", "deadline_ms", "session_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    model: str
    client_request_id: str
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    resume_tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    stopping: StoppingParams
    priority: int
    deadline_ms: int
    session_id: str
    def __init__(self, model: _Optional[str] = ..., client_request_id: _Optional[str] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., resume_tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., stopping: _Optional[_Union[StoppingParams, _Mapping]] = ..., priority: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., session_id: _Optional[str] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("job_id", "deduplicated", "seed", "generation")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    deduplicated: bool
    seed: int
    generation: int
    def __init__(self, job_id: _Optional[str] = ..., deduplicated: _Optional[bool] = ..., seed: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class WaitRequest(_message.Message):
    __slots__ = ("job_id", "from_event_index")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_EVENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    from_event_index: int
    def __init__(self, job_id: _Optional[str] = ..., from_event_index: _Optional[int] = ...) -> None: ...

class WaitEvent(_message.Message):
    __slots__ = ("index", "tokens", "final")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    index: int
    tokens: TokenChunk
    final: Final
    def __init__(self, index: _Optional[int] = ..., tokens: _Optional[_Union[TokenChunk, _Mapping]] = ..., final: _Optional[_Union[Final, _Mapping]] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("first_index", "tokens", "logprobs", "logits")
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    first_index: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    logits: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, first_index: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., logits: _Optional[_Iterable[bytes]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token", "logprob", "top")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token: int
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token: _Optional[int] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token", "logprob")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token: int
    logprob: float
    def __init__(self, token: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens", "resumed_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    resumed_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., resumed_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_s", "prefill_s", "ttft_s", "decode_s", "e2e_s")
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    E2E_S_FIELD_NUMBER: _ClassVar[int]
    queue_s: float
    prefill_s: float
    ttft_s: float
    decode_s: float
    e2e_s: float
    def __init__(self, queue_s: _Optional[float] = ..., prefill_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., decode_s: _Optional[float] = ..., e2e_s: _Optional[float] = ...) -> None: ...

class Final(_message.Message):
    __slots__ = ("finish_reason", "stop_token_id", "usage", "timings", "error", "generation", "recoveries")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RECOVERIES_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    stop_token_id: int
    usage: Usage
    timings: Timings
    error: _common_pb2.ErrorStatus
    generation: int
    recoveries: int
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., stop_token_id: _Optional[int] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ..., generation: _Optional[int] = ..., recoveries: _Optional[int] = ...) -> None: ...

class FollowRequest(_message.Message):
    __slots__ = ("attach", "detach")
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    DETACH_FIELD_NUMBER: _ClassVar[int]
    attach: FollowAttach
    detach: int
    def __init__(self, attach: _Optional[_Union[FollowAttach, _Mapping]] = ..., detach: _Optional[int] = ...) -> None: ...

class FollowAttach(_message.Message):
    __slots__ = ("follow_id", "wait")
    FOLLOW_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    follow_id: int
    wait: WaitRequest
    def __init__(self, follow_id: _Optional[int] = ..., wait: _Optional[_Union[WaitRequest, _Mapping]] = ...) -> None: ...

class FollowReply(_message.Message):
    __slots__ = ("updates",)
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: _containers.RepeatedCompositeFieldContainer[FollowedEvents]
    def __init__(self, updates: _Optional[_Iterable[_Union[FollowedEvents, _Mapping]]] = ...) -> None: ...

class FollowedEvents(_message.Message):
    __slots__ = ("follow_id", "events", "error")
    FOLLOW_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    follow_id: int
    events: _containers.RepeatedCompositeFieldContainer[WaitEvent]
    error: _common_pb2.ErrorStatus
    def __init__(self, follow_id: _Optional[int] = ..., events: _Optional[_Iterable[_Union[WaitEvent, _Mapping]]] = ..., error: _Optional[_Union[_common_pb2.ErrorStatus, _Mapping]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("already_finished",)
    ALREADY_FINISHED_FIELD_NUMBER: _ClassVar[int]
    already_finished: bool
    def __init__(self, already_finished: _Optional[bool] = ...) -> None: ...
