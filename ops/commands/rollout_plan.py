"""What `calctl rollout` checks before it changes anything, and what it remembers of each board;
not a command itself (no COMMAND).

`plan_rollout(targets, access, alias)` asks every board's Status first and refuses the whole
rollout (FailedPrecondition, nothing touched) unless every board answers, is SERVING and not
draining, and serves the alias (READY). For each board it keeps the generation and the package path
the alias serves now (`BoardPlan`): a board whose new package fails is put back on that package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calculet.common.errors import CalculetError, FailedPrecondition
from calculet.ops.commands.access import DaemonAccess
from calculet.v1 import common_pb2, observe_pb2


@dataclass(frozen=True)
class BoardPlan:
    """One board to roll.

    Attributes:
        target: its daemon address.
        name: its board name (BoardInfo.name).
        old_generation: the alias's generation before the rollout.
        old_package: the package path (relative to the daemon's models root) it serves now.
    """

    target: str
    name: str
    old_generation: int
    old_package: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.target})" if self.name else self.target


def plan_rollout(targets: Sequence[str], access: DaemonAccess, alias: str) -> list[BoardPlan]:
    """The boards in order, checked.

    Raises:
        FailedPrecondition: no board, a board twice, or a board that cannot be asked, is not
            SERVING, is draining, or does not serve `alias` (every problem in one message).
    """
    if not targets:
        raise FailedPrecondition("rollout: no boards")
    if len(set(targets)) != len(targets):
        raise FailedPrecondition(f"rollout: a board is listed twice: {', '.join(targets)}")
    plans: list[BoardPlan] = []
    problems: list[str] = []
    for target in targets:
        try:
            with access.client(target) as client:
                status = client.status()
        except CalculetError as err:
            problems.append(f"{target}: cannot be asked ({err.kind.value}: {err})")
            continue
        plan, problem = _board_plan(target, status, alias)
        if problem:
            problems.append(f"{target}: {problem}")
        elif plan is not None:
            plans.append(plan)
    if problems:
        raise FailedPrecondition(f"rollout refused, nothing changed: {'; '.join(problems)}")
    return plans


def _board_plan(target: str, status: observe_pb2.StatusResponse, alias: str) -> tuple[BoardPlan | None, str | None]:
    if status.draining:
        return None, "draining already (resume it, or leave it out)"
    ready = common_pb2.MODEL_STATE_READY
    model = next((m for m in status.models if m.alias == alias and m.state == ready), None)
    if model is None:
        return None, f"does not serve {alias!r}"
    if status.health != common_pb2.SERVING_STATUS_SERVING:
        return None, "not serving"
    return BoardPlan(target, status.board.name, model.generation, model.package_path), None
