"""The escalations of docs/sources.md 000 §14, acted on one at a time on a thread of their own.

Data flow: the engine's completion thread decides an escalation (`escalation_watch.py`: repeated CCU
exceptions, repeated non-finite outputs) and a halt listener reports a LOST board; both hand it to
`Escalator.request`, which never blocks. The escalator's thread runs each through
`EscalationActions` (which `DeviceCore` builds), since every action blocks: device resets, golden
checks, model loads.

- CCU: an automatic ResetCCU, or a ResetConfiguration with a re-warm when they recur
  (`automatic.automatic_reset`), within the automatic reset budget.
- QUARANTINE: the generation is quarantined and its golden check re-run (`golden.recheck`: device
  faults during it are retried, never held against the model); it serves again, or, on a mismatch
  the re-check reproduces, rolls back to the previous package or is Failed and unloaded
  (`ModelManager.recheck`); audited as kind "quarantine".
- UNHEALTHY: the board is lost (device lost, a job hung after a reset). It has already stopped
  serving and failed its jobs (a gateway resumes them elsewhere). The device's configuration is
  reset; if the device then answers, the halt is lifted and the models warmed again. Otherwise the
  process asks to exit with `EXIT_DEVICE_UNHEALTHY` so its supervisor (systemd: `Restart=`)
  restarts it; audited as kind "restart".

Owner: `DeviceCore` (one per board). Requests made while one of the same kind and generation waits
are merged.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import deque

from calculet.daemon.core.resets.escalation_watch import Escalation

log = logging.getLogger(__name__)

EXIT_DEVICE_UNHEALTHY = 75  # EX_TEMPFAIL: the device stayed unhealthy after a reset; restart the process


class EscalationActions(ABC):
    """What the escalator does for each kind (`DeviceCore` implements it with the engine, the reset
    controller and the model manager; tests with fakes)."""

    @abstractmethod
    def act(self, escalation: Escalation) -> None:
        """Carry out one escalation, blocking until it is done, and audit it.

        Raises:
            Nothing: an action that fails is logged and audited by the action itself.
        """


class Escalator:
    """Runs escalations one at a time on its own thread (module docstring).

    Args:
        actions: what each escalation does.
    """

    def __init__(self, actions: EscalationActions) -> None:
        self._actions = actions
        self._cond = threading.Condition()
        self._pending: deque[Escalation] = deque()
        self._busy = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="escalations", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Drop what waits and stop once the running action ends (up to `timeout` seconds)."""
        with self._cond:
            self._stopping = True
            self._pending.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def request(self, escalation: Escalation) -> None:
        """Queue an escalation; never blocks (called from engine threads, some under the engine lock)."""
        with self._cond:
            if self._stopping:
                return
            key = (escalation.kind, escalation.generation)
            if any((e.kind, e.generation) == key for e in self._pending):
                return
            self._pending.append(escalation)
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing waits or runs (tests). Returns whether it is idle."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopping)
                if self._stopping:
                    return
                escalation = self._pending.popleft()
                self._busy = True
            try:
                self._actions.act(escalation)
            except Exception:  # a bug in an action must not end the escalations for good
                log.exception("escalation %s (%s) failed", escalation.kind.value, escalation.reason)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
