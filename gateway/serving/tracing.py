"""What the serving layer knows of a request's trace: its id, and one scope per board attempt.

`RequestScope` is created for each HTTP request by `calculet.gateway.telemetry.request_context` (the
only code that imports OpenTelemetry); the serving code calls `attempt(board)` before each Submit
and sends `AttemptScope.metadata` with it: `x-request-id` always (the daemon logs the job under
it) and, when tracing is on, the W3C `traceparent` of the attempt's span, so the daemon's spans
join the gateway's trace. `PlainScope` is the scope without tracing (no spans, no cost).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

REQUEST_ID_METADATA = "x-request-id"


class AttemptScope(ABC):
    """One Submit of a choice to one board, from its start to its end. Owned by its ChoiceRunner."""

    metadata: tuple[tuple[str, str], ...]

    @abstractmethod
    def end(self, error: BaseException | None) -> None:
        """The attempt is over.

        Args:
            error: why it failed (the choice moves on or gives up), None when the job ended.
        Returns:
            Nothing.
        Raises:
            Nothing.
        """


class RequestScope(ABC):
    """One HTTP request's id and trace; called on the event loop."""

    request_id: str

    @abstractmethod
    def attempt(self, board: str, resumed_tokens: int) -> AttemptScope:
        """Start an attempt on `board`.

        Args:
            board: the board's target.
            resumed_tokens: tokens the choice already has (> 0: a failover).
        Returns:
            The attempt's scope; its metadata goes with the Submit.
        """


class _PlainAttempt(AttemptScope):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def end(self, error: BaseException | None) -> None:
        pass


class PlainScope(RequestScope):
    """The request id alone (tracing off, or a caller outside HTTP such as a unit test)."""

    def __init__(self, request_id: str = "") -> None:
        self.request_id = request_id
        self._attempt = _PlainAttempt(((REQUEST_ID_METADATA, request_id),) if request_id else ())

    def attempt(self, board: str, resumed_tokens: int) -> AttemptScope:
        return self._attempt
