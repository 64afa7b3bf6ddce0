"""`TokenizePool`: long prompts tokenized off the event loop, within a budget (docs/gateway.md,
"Bounded requests").

A long prompt costs its tokenizer time roughly in proportion to its characters (one 1 MB word took
0.6 s). On the event loop, or on a thread holding the GIL, that time is every other client's wait.
So a prompt over `inline_chars` is tokenized here: on the pool's own threads (`threads`, 1 by
default, so hostile prompts queue behind each other instead of taking every core), with
`ModelText.encode`, which releases the GIL while it runs. The characters admitted at once (running
and queued) are bounded by `budget_chars`: past it a new long prompt is refused with OVERLOADED
(HTTP 429 with Retry-After) before anything is queued, so a flood of large prompts bounds the
gateway's memory instead of growing its queue. Short prompts cost less than a hand-off to a thread
and are encoded inline.

Ownership: the pool owns its threads (`close` ends them); a caller owns the ids it gets back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from calculet.common.errors import Overloaded, Unavailable

T = TypeVar("T")

# Prompts up to this many characters are tokenized inline: well under a millisecond.
INLINE_CHARS = 4096
# Characters of long prompts admitted at once, running and queued: about 4 bodies of the default
# 4 MiB limit, each tokenized in well under the client's patience.
DEFAULT_BUDGET_CHARS = 16 << 20
RETRY_AFTER_S = 1.0


class TokenizePool:
    """Runs tokenizations of long texts on its own threads, within a budget of characters.

    Args:
        threads: worker threads (tokenizations of long prompts that run at once).
        budget_chars: characters of long prompts admitted at once (running and queued).
        inline_chars: texts up to this long run inline, on the caller's thread.
    """

    def __init__(
        self, threads: int = 1, budget_chars: int = DEFAULT_BUDGET_CHARS, inline_chars: int = INLINE_CHARS
    ) -> None:
        self.budget_chars = budget_chars
        self.inline_chars = inline_chars
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")
        self._lock = threading.Lock()
        self._admitted = 0  # characters of long texts running or queued

    @property
    def admitted_chars(self) -> int:
        """Characters of long texts running or queued now."""
        return self._admitted

    async def run(self, chars: int, work: Callable[[], T]) -> T:
        """`work()` (a tokenization of `chars` characters): inline when short, else on the pool.

        Raises:
            Overloaded: the text is long and admitting it would pass the budget (nothing queued).
            Unavailable: the pool is closed.
            Whatever `work` raises.
        """
        if chars <= self.inline_chars:
            return work()
        with self._lock:
            if self._admitted and self._admitted + chars > self.budget_chars:
                raise Overloaded(
                    f"the gateway is tokenizing {self._admitted} characters of other long prompts; "
                    f"this one has {chars}: retry later",
                    retry_after_s=RETRY_AFTER_S,
                )
            self._admitted += chars  # one text alone may pass the budget: the body limit bounds it
        try:
            future = self._executor.submit(work)
        except RuntimeError:  # closed: the gateway is stopping
            self._release(chars)
            raise Unavailable("the gateway is stopping") from None
        # Released when the work ends (or is dropped from the queue), not when its caller stops
        # waiting: a client that went away leaves its tokenization running to its end.
        future.add_done_callback(lambda _: self._release(chars))
        return await asyncio.wrap_future(future)

    def _release(self, chars: int) -> None:
        with self._lock:
            self._admitted -= chars

    def close(self) -> None:
        """End the threads (queued work is dropped; running work finishes)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
