"""`ServingObserver`: what the serving layer tells telemetry (the gateway's metrics implement it;
`calculet.gateway.telemetry`). The serving code calls it; it never imports OpenTelemetry."""

from __future__ import annotations

from abc import ABC


class ServingObserver(ABC):  # noqa: B024  (no-op defaults: override what you need)
    """Events of the retry and failover logic and of the answer memory, called on the event loop
    (must not block)."""

    def resubmitted(self, model: str, *, mid_stream: bool) -> None:  # noqa: B027 (a no-op default)
        """A choice is submitted again after an attempt failed.

        Args:
            model: the requested model alias.
            mid_stream: tokens had been streamed already (a failover with resume_tokens), else a retry
                before the first token.
        Returns:
            Nothing.
        Raises:
            Nothing: an observer must not fail the request.
        """

    def answers_recalled(  # noqa: B027 (a no-op default)
        self, model: str, *, spliced: int, missed: int, fallback: bool
    ) -> None:
        """A chat prompt was rendered with the answer memory on (once per package tried).

        Args:
            model: the requested model alias.
            spliced: assistant messages replaced by their remembered ids (0 on a fallback).
            missed: assistant messages with content the memory does not hold.
            fallback: some were remembered but the template did not pass the placeholders through
                unchanged, so the plain rendering was encoded instead.
        Returns:
            Nothing.
        Raises:
            Nothing: an observer must not fail the request.
        """


class NoObserver(ServingObserver):
    """The default: nobody listens."""
