"""`WorkerSupervisor`: keeps N gateway workers running until it is told to stop, then stops them gracefully.

Each worker slot (an index, 0 .. N-1) has a task that starts the slot's process, waits for it to
exit and, unless the gateway is stopping, starts it again after the delay `restarts.RestartBackoff`
gives (or gives up the whole gateway when every start fails). Readiness comes from the workers'
own notifications (`notify.NotifyReceiver` calls `worker_message`): once every slot's process has
said READY=1, the supervisor tells systemd READY=1; `STATUS=` shows how many are ready. `stop()`
(SIGTERM, SIGINT) tells systemd STOPPING=1, sends each worker SIGTERM (uvicorn stops accepting and
finishes its running requests for up to 30 s, then the worker closes its fleet) and waits for all
of them, killing any still there after `stop_grace_s`.

Nothing here polls: every wait is on a process's exit, an event or a timeout. The processes come
from a `WorkerLauncher`, so the logic is tested with fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from calculet.common.sd_notify import Notifier
from calculet.gateway.workers.launcher import WorkerLauncher, WorkerProcess
from calculet.gateway.workers.restarts import RestartBackoff, RestartPolicy

log = logging.getLogger("calculet.gateway.workers")

# uvicorn's 30 s for running requests, then closing the fleet; below the unit's TimeoutStopSec=45s and
# the Kubernetes pod's grace after its preStop sleep (tests check both).
STOP_GRACE_S = 35.0
EXIT_OK = 0
EXIT_GAVE_UP = 1


@dataclass
class _Slot:
    """One worker index: its process now (None between processes) and since when it is ready."""

    index: int
    process: WorkerProcess | None = None
    ready_at: float | None = None


class WorkerSupervisor:
    """Runs `count` workers from `launcher` (module docstring).

    Args:
        launcher: starts one worker process.
        count: how many workers.
        notifier: systemd's notify socket (None: not under systemd).
        policy: restart delays and the limit of failed starts.
        stop_grace_s: how long stopping workers may take before they are killed.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        launcher: WorkerLauncher,
        count: int,
        *,
        notifier: Notifier | None = None,
        policy: RestartPolicy | None = None,
        stop_grace_s: float = STOP_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._launcher = launcher
        self._slots = [_Slot(i) for i in range(count)]
        self._notifier = notifier or Notifier(None)
        self._policy = policy or RestartPolicy()
        self._stop_grace_s = stop_grace_s
        self._clock = clock
        self._stopping = asyncio.Event()
        self._announced = False  # READY=1 sent to systemd
        self.gave_up = False
        self.started = 0  # processes started, restarts included

    @property
    def count(self) -> int:
        return len(self._slots)

    @property
    def stopping(self) -> bool:
        """`stop()` was called."""
        return self._stopping.is_set()

    def pids(self) -> list[int | None]:
        """Each slot's process id now (None: between processes)."""
        return [s.process.pid if s.process is not None else None for s in self._slots]

    def ready(self) -> list[bool]:
        """Whether each slot's process is ready now."""
        return [s.ready_at is not None for s in self._slots]

    def stop(self) -> None:
        """Stop every worker and end `run` (idempotent; a signal handler)."""
        self._stopping.set()

    async def run(self) -> int:
        """Start the workers and keep them running until `stop()`; then stop them.

        Returns:
            0 after a stop, 1 when a worker failed to start too many times in a row (all stopped).
        """
        keepers = [asyncio.create_task(self._keep(slot), name=f"worker {slot.index}") for slot in self._slots]
        try:
            await self._stopping.wait()
            log.info("stopping %d workers", self.count)
            self._notifier.stopping("stopping: workers finishing running requests")
            for slot in self._slots:
                if slot.process is not None:
                    slot.process.terminate()
            _, late = await asyncio.wait(keepers, timeout=self._stop_grace_s)
            if late:
                log.error("workers %s still running after %.0f s: killed", self._running(), self._stop_grace_s)
                for slot in self._slots:
                    if slot.process is not None:
                        slot.process.kill()
                await asyncio.wait(late)
        finally:
            for task in keepers:
                task.cancel()
            await asyncio.gather(*keepers, return_exceptions=True)
        log.info("workers stopped")
        return EXIT_GAVE_UP if self.gave_up else EXIT_OK

    def worker_message(self, pid: int, fields: list[str]) -> None:
        """A notification from a worker (`NotifyReceiver`'s handler): READY=1 marks it ready."""
        slot = next((s for s in self._slots if s.process is not None and s.process.pid == pid), None)
        if slot is None or "READY=1" not in fields or slot.ready_at is not None:
            return
        slot.ready_at = self._clock()
        log.info("worker %d (pid %d) ready", slot.index, pid)
        ready = sum(self.ready())
        if self._stopping.is_set():
            return
        if self._announced:
            self._notifier.status(f"serving: {ready} of {self.count} workers ready")
        elif ready == self.count:
            self._announced = True
            self._notifier.ready(f"serving: {ready} workers")
        else:
            self._notifier.status(f"starting: {ready} of {self.count} workers ready")

    async def _keep(self, slot: _Slot) -> None:
        """Fill `slot` with a process until stopping (or giving up); a defect here stops the gateway."""
        try:
            await self._fill(slot)
        except Exception:
            log.exception("worker %d: supervision failed: stopping the gateway", slot.index)
            self.gave_up = True
            self.stop()

    async def _fill(self, slot: _Slot) -> None:
        backoff = RestartBackoff(self._policy)
        while not self._stopping.is_set():
            code = await self._run_once(slot)
            if self._stopping.is_set():
                return
            ready_for = self._clock() - slot.ready_at if slot.ready_at is not None else None
            slot.ready_at = None
            delay = backoff.exited(ready_for)
            if delay is None:
                log.error(
                    "worker %d failed to start %d times in a row (last exit %s): stopping the gateway",
                    slot.index, backoff.failed_starts, code,
                )  # fmt: skip
                self.gave_up = True
                self.stop()
                return
            log.warning(
                "worker %d exited (%s) %s; starting it again in %.1f s",
                slot.index, code, "after serving" if ready_for is not None else "before it was ready", delay,
            )  # fmt: skip
            if self._announced:
                self._notifier.status(f"serving: {sum(self.ready())} of {self.count} workers ready")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def _run_once(self, slot: _Slot) -> int | str:
        """Start `slot`'s process and wait for its exit: its status, or why it did not start."""
        try:
            process = await self._launcher.start(slot.index)
        except OSError as err:
            return f"not started: {err}"
        self.started += 1
        slot.process = process
        log.info("worker %d started (pid %d)", slot.index, process.pid)
        if self._stopping.is_set():  # stop() came while it started: run() may have signalled the others already
            process.terminate()
        try:
            return await process.wait()
        finally:
            slot.process = None

    def _running(self) -> list[int]:
        return [s.index for s in self._slots if s.process is not None]
