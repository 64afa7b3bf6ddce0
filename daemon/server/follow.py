"""`FollowSession`: the attachments of one Follow stream (many Waits on one gRPC stream).

A decode step appends one token to each of N sequences' event logs. With one Wait stream per
sequence that is N gRPC messages, N coroutine wake-ups and N writes on the daemon (and N reads on
the client) per step; with Follow the client attaches every job it waits on to one stream and each
step costs one message carrying every attachment's new events.

Data flow: the servicer's request reader calls `attach` / `detach` (on the event loop); each
attachment subscribes to its job's `EventLog`, whose listener (called on an engine thread after
every append) marks the attachment changed and calls `wake`; the servicer's stream loop then calls
`collect`, which reads the changed attachments only; the servicer converts the `FollowUpdate`s to
one reply (`wire.follow_reply_to_pb`) and sends it.

Ownership: the session owns its attachments and their log subscriptions; `close` (the stream is
over) unsubscribes them all. An attachment is dropped after the update that carries its Final,
its error, or its empty end. The session never cancels a job (as closing a Wait stream does not).
Not thread-safe apart from the log listeners (which take the session's small lock) and `wake`:
everything else runs on the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from calculet.common.errors import CalculetError, InvalidArgument
from calculet.daemon.core.events import Event, EventLog, FinalEvent, TokenChunk
from calculet.daemon.server.checks import wait_start

# What one reply may carry before the rest waits for the next one, in units of about 10 bytes on
# the wire (a token, a logprob, an alternative): far below gRPC's 4 MiB message limit even for a
# re-attach that replays thousands of events with logprobs.
REPLY_BUDGET = 100_000


def event_weight(event: Event) -> int:
    """The event's share of `REPLY_BUDGET`."""
    if isinstance(event, TokenChunk):
        return 1 + len(event.tokens) + sum(1 + len(lp.top) for lp in event.logprobs)
    return 8


@dataclass
class FollowUpdate:
    """What one attachment's Wait would have sent since the last reply.

    `events` in index order (the last may be the Final); `error` when the attach was refused (then
    no events); neither: the attachment ended without events (attached past its job's Final).
    """

    follow_id: int
    job_id: str
    log: EventLog | None
    events: list[Event] = field(default_factory=list)
    error: CalculetError | None = None

    @property
    def ends(self) -> bool:
        """This update is the attachment's last."""
        return self.error is not None or not self.events or isinstance(self.events[-1], FinalEvent)


@dataclass
class _LiveAttachment:
    job_id: str
    log: EventLog
    index: int
    unsubscribe: Callable[[], None]


class FollowSession:
    """The live attachments of one Follow stream.

    `collect` reads only the attachments whose logs changed since it last looked (their listeners
    mark them, on the engine thread, under a small lock), so a stream holding many queued jobs
    costs each decode step the jobs that step advanced, as their own Wait streams would.

    Args:
        open_log: the job's event log for a Wait (`DeviceCore.event_log`); raises the typed error a
            Wait would fail with (NotFound, Cancelled, ...).
        wake: called (on any thread) when an attached log got events or the session has news.
    """

    def __init__(self, open_log: Callable[[str], EventLog], wake: Callable[[], None]) -> None:
        self._open_log = open_log
        self._wake = wake
        self._live: dict[int, _LiveAttachment] = {}
        self._refused: list[FollowUpdate] = []  # attach refusals and empty ends, sent next
        self._dirty_lock = threading.Lock()
        self._dirty: dict[int, None] = {}  # follow ids whose logs may hold unsent events, in order

    @property
    def attached(self) -> int:
        """Live attachments (a test and status aid)."""
        return len(self._live)

    def attach(self, follow_id: int, job_id: str, from_index: int) -> None:
        """Start following `job_id` from `from_index` (checked as a Wait request is).

        A refusal a Wait would fail with goes to the next `collect` as the attachment's error.

        Raises:
            InvalidArgument: `follow_id` names a live attachment (the stream fails: a client bug).
        """
        if follow_id in self._live:
            raise InvalidArgument(f"follow_id {follow_id} is already attached on this stream")
        try:
            log = self._open_log(job_id)
            wait_start(log, job_id, from_index)
        except CalculetError as err:
            self._refused.append(FollowUpdate(follow_id, job_id, None, error=err))
            self._wake()
            return
        self._live[follow_id] = _LiveAttachment(job_id, log, from_index, log.subscribe(self._marker(follow_id)))
        self._mark(follow_id)  # it may hold events already

    def detach(self, follow_id: int) -> None:
        """Stop following (unknown ids are ignored: a detach may race the attachment's end)."""
        attachment = self._live.pop(follow_id, None)
        if attachment is not None:
            attachment.unsubscribe()

    def collect(self, budget: int = REPLY_BUDGET) -> list[FollowUpdate]:
        """The changed attachments' new events (within `budget`), dropping the attachments that ended."""
        updates, self._refused = self._refused, []
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, {}
        pending = iter(dirty)
        for follow_id in pending:
            attachment = self._live.get(follow_id)
            if attachment is None:
                continue  # detached meanwhile
            if budget <= 0:
                self._mark(follow_id, *pending)  # the rest goes in the next reply
                break
            events = attachment.log.read(attachment.index)
            if not events:
                if attachment.log.finished:  # attached at or past the Final: nothing is left to send
                    updates.append(FollowUpdate(follow_id, attachment.job_id, attachment.log))
                    self.detach(follow_id)
                continue
            taken: list[Event] = []
            for event in events:
                taken.append(event)
                budget -= event_weight(event)
                if budget <= 0:
                    break
            attachment.index += len(taken)
            update = FollowUpdate(follow_id, attachment.job_id, attachment.log, taken)
            updates.append(update)
            if update.ends:
                self.detach(follow_id)
            elif len(taken) < len(events):
                self._mark(follow_id)  # the budget cut its events: the rest next
        return updates

    def _marker(self, follow_id: int) -> Callable[[], None]:
        return lambda: self._mark(follow_id)

    def _mark(self, *follow_ids: int) -> None:
        """These attachments may have news (any thread); wake the stream."""
        with self._dirty_lock:
            for follow_id in follow_ids:
                self._dirty[follow_id] = None
        self._wake()

    def close(self) -> None:
        """Unsubscribe every attachment (idempotent)."""
        for follow_id in list(self._live):
            self.detach(follow_id)
        self._refused.clear()
