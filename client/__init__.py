"""Python client of the Calculet board daemon (`calculet.v1.Daemon`;
docs/architecture.md, "Rooms and floors" and "Errors").

`DaemonClient` (blocking) and `AsyncDaemonClient` (asyncio) expose the three planes: inference
(`submit`, `wait`, `cancel`, `generate` -> a streaming `Generation` with `chunks()`), observation
(`health`, `status`, `get_model` -> `ModelInfo`, `watch_load` -> `LoadReport`s, `watch_health` ->
`ServingStatus`es) and operations (`load`, `load_and_wait`, `unload`, `drain`, `resume`, `reset`,
`inject_fault`). `token=` sends a bearer token on every call; `tls=TlsConfig(...)` dials with TLS
(mutual TLS with a client certificate). Requests and results use the client's own types
(`calculet.client.types`); failures raise the typed `calculet.common.errors` classes, re-exported
here. Importing this package imports neither the daemon's engine, sampler, wire module nor numpy
(a test checks).
"""

from calculet.client.async_client import AsyncDaemonClient
from calculet.client.channel import Target, TlsConfig, Transport, parse_target
from calculet.client.generation import AsyncGeneration, Generation, StreamState
from calculet.client.messages import SubmitResult
from calculet.client.sync_client import DaemonClient
from calculet.client.types import (
    Constraint,
    Event,
    FinalEvent,
    FinishReason,
    LoadReport,
    ModelInfo,
    ModelLoad,
    ModelState,
    SamplingParams,
    ServingStatus,
    ThinkingBudget,
    Timings,
    TokenChunk,
    TokenLogprob,
    Usage,
)
from calculet.common.errors import (
    Aborted,
    CalculetError,
    Cancelled,
    DeadlineExceeded,
    ErrorKind,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Overloaded,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "Aborted",
    "AsyncDaemonClient",
    "AsyncGeneration",
    "CalculetError",
    "Cancelled",
    "Constraint",
    "DaemonClient",
    "DeadlineExceeded",
    "ErrorKind",
    "Event",
    "FailedPrecondition",
    "FinalEvent",
    "FinishReason",
    "Generation",
    "InvalidArgument",
    "LoadReport",
    "ModelInfo",
    "ModelLoad",
    "ModelState",
    "NotFound",
    "Overloaded",
    "PermissionDenied",
    "SamplingParams",
    "ServingStatus",
    "StreamState",
    "SubmitResult",
    "Target",
    "ThinkingBudget",
    "Timings",
    "TlsConfig",
    "TokenChunk",
    "TokenLogprob",
    "Transport",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "parse_target",
]
