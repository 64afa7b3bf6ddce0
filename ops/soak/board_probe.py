"""One look at a board daemon over gRPC, blocking (the supervisor runs it in a worker thread).

`probe_board(target)` reads readiness (`Health`: status, reason, the reset budget) and liveness
(`grpc.health.v1` service `calculet.liveness`: NOT_SERVING when only a restart helps, e.g. a lost
device). `read_status(target)` is the full `Status` (the audit trail and counters). A board that
does not answer gives a `BoardProbe` with `reachable` False, never an exception.
`gateway_routes(url, alias)` asks the gateway's `GET /ready` how many boards it routes the alias to.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calculet.client import CalculetError, DaemonClient
from calculet.v1 import common_pb2, observe_pb2

LIVENESS_SERVICE = "calculet.liveness"
PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class BoardProbe:
    """What a probe saw (module docstring)."""

    reachable: bool
    serving: bool = False
    draining: bool = False
    reason: str = ""
    live: bool = True
    budget_exhausted: bool = False
    error: str = ""


def probe_board(target: str, timeout_s: float = PROBE_TIMEOUT_S) -> BoardProbe:
    """Readiness and liveness of the daemon at `target` (module docstring)."""
    try:
        with DaemonClient(target, timeout=timeout_s) as client:
            health = client.health()
    except CalculetError as err:
        return BoardProbe(False, error=f"{err.kind.value}: {err}")
    return BoardProbe(
        reachable=True,
        serving=health.status == common_pb2.SERVING_STATUS_SERVING,
        draining=health.status == common_pb2.SERVING_STATUS_DRAINING,
        reason=health.reason,
        live=_live(target, timeout_s),
        budget_exhausted=health.reset_budget.exhausted,
    )


def _live(target: str, timeout_s: float) -> bool:
    """False only when the daemon answers NOT_SERVING for liveness (an error is not a verdict)."""
    try:
        with grpc.insecure_channel(target) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=LIVENESS_SERVICE), timeout=timeout_s
            )
    except grpc.RpcError:
        return True
    return bool(reply.status != health_pb2.HealthCheckResponse.NOT_SERVING)


def gateway_routes(url: str, alias: str, timeout_s: float = PROBE_TIMEOUT_S) -> int | None:
    """Boards the gateway at `url` routes `alias` to now (`GET /ready`'s `models`); None when it
    does not answer."""
    try:
        reply = httpx.get(f"{url}/ready", timeout=timeout_s, trust_env=False)
        models = reply.json().get("models", {})
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    count = models.get(alias, 0) if isinstance(models, dict) else 0
    return count if isinstance(count, int) else None


def read_status(target: str, timeout_s: float = PROBE_TIMEOUT_S) -> observe_pb2.StatusResponse | str:
    """The daemon's Status, or why it could not be read (`kind: message`)."""
    try:
        with DaemonClient(target, timeout=timeout_s) as client:
            return client.status()
    except CalculetError as err:
        return f"{err.kind.value}: {err}"


def resume_board(target: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Resume (as `calctl resume`); returns what happened, for the record."""
    try:
        with DaemonClient(target, timeout=timeout_s) as client:
            reply = client.resume()
    except CalculetError as err:
        return f"refused: {err.kind.value}: {err}"
    return f"resumed (was draining: {reply.was_draining})"


def reset_board(target: str, reason: str, timeout_s: float = 60.0) -> str:
    """An operator CCU reset (what `docs/operations.md` prescribes past the reset budget)."""
    try:
        with DaemonClient(target, timeout=timeout_s) as client:
            result = client.reset("ccu", reason)
    except CalculetError as err:
        return f"refused: {err.kind.value}: {err}"
    return f"operator CCU reset: ok={result.ok}"
