"""One row per board for `calctl status` over many boards, `calctl top` and `calctl rollout`: the
figures an operator scans a fleet for, from one StatusResponse (or the error that kept calctl from
getting it); not a command itself (no COMMAND).

Pure data: `board_row(target, status)` / `unreachable_row(target, error)` -> `BoardRow` ->
`BoardRow.to_json()`, the documented `--json` shape (docs/operations.md, "calctl status --json"):

    {"target": str, "name": str, "health": "serving"|"draining"|"not_serving"|"unreachable",
     "models": [{"alias": str, "generation": int, "state": str, "lanes_used": int, "lanes_parked": int,
                 "lanes_total": int}],
     "queue": int|null, "inflight": int|null, "tokens_per_second": float|null,
     "busy_ratio": float|null, "resets": int|null, "error": str|null}

Numbers are null for an unreachable board; tokens_per_second and busy_ratio are also null when the
daemon does not report utilisation (StatusResponse.utilization, field 14, unset: an older daemon).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from calculet.common.errors import CalculetError
from calculet.ops.commands.status_view import device_utilization, model_state, serving
from calculet.v1 import observe_pb2

UNREACHABLE = "unreachable"
_IDLE_LANES = (observe_pb2.LANE_STATE_FREE, observe_pb2.LANE_STATE_PARKED)  # held by no request


@dataclass(frozen=True)
class ModelRow:
    """One model alias on a board: its generation, lifecycle state and KV lanes (used: held by a request;
    parked: a finished conversation's KV kept warm, free for admission)."""

    alias: str
    generation: int
    state: str
    lanes_used: int
    lanes_parked: int
    lanes_total: int


@dataclass(frozen=True)
class BoardRow:
    """One board as `calctl status` / `top` show it (field meanings in the module docstring).

    Attributes:
        target: the daemon address calctl dialled.
        name: the board's name (BoardInfo.name; "" when unreachable).
        health: serving, draining, not_serving, or unreachable.
        models: every alias the daemon knows, sorted by alias.
        queue: jobs waiting in the scheduler queues, all models.
        inflight: device submissions in flight now.
        tokens_per_second: generated tokens per second over the daemon's recent window.
        busy_ratio: the device's compute busy ratio over the recent window (0..1).
        resets: device resets since the daemon started.
        error: why the Status call failed (`<kind>: <message>`), for an unreachable board.
    """

    target: str
    name: str
    health: str
    models: tuple[ModelRow, ...]
    queue: int | None
    inflight: int | None
    tokens_per_second: float | None
    busy_ratio: float | None
    resets: int | None
    error: str | None

    @property
    def reachable(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["models"] = [asdict(m) for m in self.models]
        return data


def board_row(target: str, status: observe_pb2.StatusResponse) -> BoardRow:
    """The row of a board from its Status answer."""
    models = tuple(
        ModelRow(
            alias=m.alias,
            generation=m.generation,
            state=model_state(m.state).lower(),
            lanes_used=sum(1 for lane in m.lanes if lane.state not in _IDLE_LANES),
            lanes_parked=sum(1 for lane in m.lanes if lane.state == observe_pb2.LANE_STATE_PARKED),
            lanes_total=len(m.lanes),
        )
        for m in status.models
    )
    queue = sum(m.queues.decode_ready + m.queues.short_prefill + m.queues.long_prefill for m in status.models)
    tokens_per_second, busy_ratio = utilization(status)
    return BoardRow(
        target=target,
        name=status.board.name,
        health=serving(status.health).lower(),
        models=models,
        queue=queue,
        inflight=status.inflight_submissions,
        tokens_per_second=tokens_per_second,
        busy_ratio=busy_ratio,
        resets=status.resets.count,
        error=None,
    )


def unreachable_row(target: str, error: CalculetError) -> BoardRow:
    """The row of a board whose Status call failed."""
    return BoardRow(target, "", UNREACHABLE, (), None, None, None, None, None, f"{error.kind.value}: {error}")


def utilization(status: observe_pb2.StatusResponse) -> tuple[float | None, float | None]:
    """(tokens per second, busy ratio) over the daemon's recent window; the since-start busy ratio
    when the daemon reports no recent window yet; (None, None) when it reports no utilisation."""
    u = device_utilization(status)
    if u is None:
        return None, None
    busy = u.recent_busy_ratio if u.recent_window_seconds > 0 else u.busy_ratio
    return float(u.tokens_per_second), float(busy)
