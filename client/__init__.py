"""Python client of the Calculet board daemon (`calculet.v1.Daemon`, DESIGN.md sections 2 and 6).

`DaemonClient` (blocking) and `AsyncDaemonClient` (asyncio) expose the three planes: inference
(`submit`, `wait`, `cancel`, `generate` -> a streaming `Generation`), observation (`health`,
`status`, `get_model`, `watch_load`) and operations (`load`, `load_and_wait`, `unload`, `drain`,
`resume`, `reset`, `inject_fault`). Failures raise the typed `calculet.daemon.errors` classes.
"""

from calculet.client.async_client import AsyncDaemonClient
from calculet.client.channel import Target, Transport, parse_target
from calculet.client.generation import AsyncGeneration, Generation, StreamState
from calculet.client.messages import SubmitResult
from calculet.client.sync_client import DaemonClient

__all__ = [
    "AsyncDaemonClient",
    "AsyncGeneration",
    "DaemonClient",
    "Generation",
    "StreamState",
    "SubmitResult",
    "Target",
    "Transport",
    "parse_target",
]
