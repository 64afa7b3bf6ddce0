"""`JobLog`: one INFO line when a client job is queued and one when it ends, with its request id.

The lines carry the caller's request id (the gateway's `x-request-id`), the job id and the model in
the message and, for `--log-format json`, as fields (`logs.CONTEXT_FIELDS`). An `EngineObserver`:
it runs on the hub's thread, never on the engine's, and receives only the two request events
(the hub queues no event type its observers do not handle). Warm-up probes are not logged.
"""

from __future__ import annotations

import logging

from calculet.daemon.core.observe.observer import EngineObserver, RequestFinished, RequestQueued

log = logging.getLogger("calculet.daemon.jobs")


class JobLog(EngineObserver):
    """Request ids by live job id (dropped at the job's end), and the two lines per job."""

    def __init__(self) -> None:
        self._request_ids: dict[str, str] = {}

    def request_queued(self, event: RequestQueued) -> None:
        if event.internal:
            return
        rid = event.trace.request_id
        self._request_ids[event.job_id] = rid
        log.info(
            "job %s queued: request %s, model %s generation %d, %d prompt tokens, %d resumed",
            event.job_id, rid or "-", event.model, event.generation, event.prompt_tokens, event.resumed_tokens,
            extra={"request_id": rid, "job_id": event.job_id, "model": event.model},
        )  # fmt: skip

    def request_finished(self, event: RequestFinished) -> None:
        if event.internal:
            return
        rid = self._request_ids.pop(event.job_id, "")
        error = f" ({event.error_kind.value})" if event.error_kind is not None else ""
        log.info(
            "job %s finished: request %s, %s%s, %d tokens, ttft %.1f ms, e2e %.1f ms",
            event.job_id, rid or "-", event.reason.value, error, event.usage.completion_tokens,
            event.timings.ttft * 1000, event.timings.e2e * 1000,
            extra={"request_id": rid, "job_id": event.job_id, "model": event.model},
        )  # fmt: skip
