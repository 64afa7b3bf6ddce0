"""The client jobs of one board: live sequences, finished ones kept for Wait and Submit retries, and
the client_request_id index that makes Submit idempotent.

A job (the client's unit: one Submit, one job id, one `ClientJob`) is `add`ed when it is queued, stays
live until its Final, then `retire` moves it into `Retention` (bounded by bytes and age) where Wait
can still re-attach and an identical Submit retry finds it. An evicted job's id answers NOT_FOUND and
its client_request_id is free again.

Owner: the `Engine`; guarded by the engine lock (not thread-safe on its own).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from calculet.common.errors import FailedPrecondition
from calculet.daemon.core.client_job import ClientJob
from calculet.daemon.core.events import Retention, job_bytes


class JobTable:
    """Live and retained jobs by id, and client_request_id -> (job id, request digest).

    Args:
        retention_bytes / retention_s: bounds of the finished jobs kept (see `events.Retention`).
    """

    def __init__(self, retention_bytes: int, retention_s: float) -> None:
        self._live: dict[str, ClientJob] = {}
        self._retained: Retention[ClientJob] = Retention(retention_bytes, retention_s)
        self._by_client_id: dict[str, tuple[str, bytes]] = {}

    def __len__(self) -> int:
        """Live jobs."""
        return len(self._live)

    def __iter__(self) -> Iterator[ClientJob]:
        """Live jobs, oldest first."""
        return iter(list(self._live.values()))

    def is_live(self, job_id: str) -> bool:
        return job_id in self._live

    def add(self, seq: ClientJob, digest: bytes) -> None:
        """A newly queued job; `digest` identifies its request for Submit retries."""
        self._live[seq.job_id] = seq
        if key := seq.request.client_request_id:
            self._by_client_id[key] = (seq.job_id, digest)

    def get(self, job_id: str) -> ClientJob | None:
        """A live job, or a finished one still retained (those past the retention age go first)."""
        self.expire()
        return self._live.get(job_id) or self._retained.get(job_id)

    def retire(self, seq: ClientJob) -> bool:
        """Move a finished job to retention. Returns False when it was not live (finished twice)."""
        if self._live.pop(seq.job_id, None) is None:
            return False
        seq.release_inputs()
        logits = seq.first_logits.nbytes if seq.first_logits is not None else 0  # warm-up probes: a vocab row
        self._forget(self._retained.add(seq.job_id, seq, job_bytes(seq.log) + logits))
        return True

    def deduplicate(self, client_id: str, digest: bytes) -> ClientJob | None:
        """The job an earlier Submit with this client_request_id started, while live or retained.

        Raises:
            FailedPrecondition: that job's request differs from the one with `digest`.
        """
        self.expire()
        known = self._by_client_id.get(client_id)
        if known is None:
            return None
        job_id, first = known
        if not hmac.compare_digest(first, digest):
            # Neither the job id nor anything else about the first request is revealed.
            raise FailedPrecondition("client_request_id: already used for a different request; use a new id")
        seq = self._live.get(job_id) or self._retained.get(job_id)
        assert seq is not None, "the index names only live and retained jobs"
        return seq

    def expire(self) -> None:
        """Drop retained jobs past the retention age."""
        self._forget(self._retained.expire())

    @property
    def retained_bytes(self) -> int:
        return self._retained.nbytes

    @property
    def retained_count(self) -> int:
        return len(self._retained)

    @property
    def client_ids(self) -> int:
        """client_request_ids still answered from live or retained jobs."""
        return len(self._by_client_id)

    def _forget(self, evicted: list[ClientJob]) -> None:
        """Evicted jobs' ids answer NOT_FOUND from now on; their client_request_ids are free again."""
        for old in evicted:
            key = old.request.client_request_id
            if key and self._by_client_id.get(key, ("", b""))[0] == old.job_id:
                del self._by_client_id[key]
