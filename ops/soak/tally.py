"""The running tally of judged requests: counts by class and by kind, allowed failures by rule,
and the first `MAX_EXAMPLES` requests of each bad class with their messages (bounded, so a long
run's report stays small), plus the `RequestPoint`s the windows and drift are computed from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from calculet.ops.soak.classify import Judgement, RequestClass
from calculet.ops.soak.points import RequestPoint

MAX_EXAMPLES = 20


@dataclass
class Tally:
    """Judged requests of one phase (calibration or soak)."""

    points: list[RequestPoint] = field(default_factory=list)
    by_class: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    allowed_by_rule: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)
    _examples_by_class: Counter[str] = field(default_factory=Counter)

    def add(self, point: RequestPoint, judgement: Judgement, request_id: str, turn: int) -> None:
        """Count one judged request (`request_id`: the `x-request-id` it was sent with)."""
        self.points.append(point)
        cls = judgement.cls.value
        self.by_class[cls] += 1
        self.by_kind.setdefault(point.kind, Counter())[cls] += 1
        if judgement.allowed_by is not None:
            self.allowed_by_rule[judgement.allowed_by] += 1
        if judgement.cls in (RequestClass.OK, RequestClass.CANCELLED):
            return
        label = cls
        if judgement.cls is RequestClass.FAILED:
            label = "allowed" if judgement.allowed_by else "disallowed"
        if self._examples_by_class[label] < MAX_EXAMPLES:
            self._examples_by_class[label] += 1
            self.examples.append(
                {
                    "t_s": round(point.end_s, 3),
                    "request_id": request_id,
                    "turn": turn + 1,
                    "kind": point.kind,
                    "class": cls,
                    "allowed_by": judgement.allowed_by,
                    "detail": judgement.detail[:500],
                }
            )

    @property
    def total(self) -> int:
        return sum(self.by_class.values())

    @property
    def allowed(self) -> int:
        return sum(self.allowed_by_rule.values())

    @property
    def disallowed(self) -> int:
        return self.by_class[RequestClass.FAILED.value] - self.allowed

    def to_json(self) -> dict[str, Any]:
        total = self.total
        return {
            "total": total,
            "by_class": {c.value: self.by_class[c.value] for c in RequestClass},
            "by_kind": {k: dict(v) for k, v in sorted(self.by_kind.items())},
            "failed_allowed": self.allowed,
            "failed_allowed_by_rule": dict(self.allowed_by_rule),
            "failed_disallowed": self.disallowed,
            "allowed_rate": round(self.allowed / total, 5) if total else None,
            "examples": self.examples,
        }
