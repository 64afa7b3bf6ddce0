"""`GenerationOps`: the engine's model-generation operations, what the model manager and the reset
controller's callers ask of the engine about generations (add, start jobs, publish, fence, drain,
quarantine, cancel, wait until idle), each one step under the engine lock.

The engine owns one and hands it out as `Engine.generations`. It shares the engine's lock and state
(the generation table, the job table, the bookkeeper, the executor), given at construction; it holds
no state of its own, so `engine.py` keeps to the job and device-job flow.
"""

from __future__ import annotations

import threading
import time

from calculet.common.errors import ErrorKind
from calculet.daemon.core.bookkeeping import Bookkeeper
from calculet.daemon.core.events import FinishReason
from calculet.daemon.core.executor import Executor
from calculet.daemon.core.generations import GenerationTable
from calculet.daemon.core.job_table import JobTable
from calculet.daemon.core.model_state import ModelState
from calculet.daemon.core.prefill_offset import OffsetDecision
from calculet.daemon.core.request import ModelLimits
from calculet.daemon.core.runtime import ModelRuntime
from calculet.daemon.device.api import ConfiguredModel


class GenerationOps:
    """The engine's generation operations (module docstring); every method takes the engine lock.

    Args:
        cond: the engine's lock and condition.
        generations / jobs / book / executor: the engine's state they act on.
    """

    def __init__(
        self,
        cond: threading.Condition,
        generations: GenerationTable,
        jobs: JobTable,
        book: Bookkeeper,
        executor: Executor,
    ) -> None:
        self._cond = cond
        self._generations = generations
        self._jobs = jobs
        self._book = book
        self._executor = executor

    def add_generation(self, rt: ModelRuntime) -> None:
        """A new generation exists (Validating); it runs no job until `start_jobs`."""
        with self._cond:
            self._generations.add(rt)

    def start_jobs(self, rt: ModelRuntime) -> None:
        """Let jobs of this configured generation run (warming included); publishing is separate."""
        with self._cond:
            self._generations.start_jobs(rt)
            self._cond.notify_all()

    def publish(self, rt: ModelRuntime) -> ModelRuntime | None:
        """Atomically point the alias at `rt`; returns the generation it replaced."""
        with self._cond:
            return self._generations.publish(rt)

    def unpublish(self, alias: str, generation: int) -> None:
        with self._cond:
            self._generations.unpublish(alias, generation)

    def fence_generation(self, generation: int) -> None:
        """From now on no job of this generation runs, and a late completion touches nothing of it."""
        with self._cond:
            self._generations.stop_jobs(generation)

    def remove_generation(self, generation: int) -> None:
        with self._cond:
            self._generations.remove(generation)

    def begin_draining(self, rt: ModelRuntime) -> bool:
        """Move a Ready generation to Draining (its alias answers UNAVAILABLE unless a newer one took
        it over). Returns False when it is not Ready: someone else is retiring it."""
        with self._cond:
            if rt.state is not ModelState.READY:
                return False
            rt.lifecycle.move(ModelState.DRAINING)
            return True

    def generation_list(self) -> list[ModelRuntime]:
        """Every generation not yet unloaded, oldest first."""
        with self._cond:
            return self._generations.all()

    def published(self, alias: str) -> ModelRuntime | None:
        """The generation published under `alias` (in any state), or None."""
        with self._cond:
            return self._generations.published(alias)

    def serving_generations(self) -> tuple[str, ...]:
        """ "alias@generation (package)" of every serving model (the reset audit's before and after)."""
        with self._cond:
            return self._book.serving_generations()

    def serving_limits(self, alias: str) -> ModelLimits | None:
        """The limits of the alias's serving generation, or None when none serves. O(1)."""
        with self._cond:  # a published runtime keeps its model until it is unpublished
            rt = self._generations.published(alias)
            return rt.limits if rt is not None and rt.model is not None and rt.state.serving else None

    def count_sequences(self, generation: int) -> int:
        with self._cond:
            return sum(1 for s in self._jobs if s.generation == generation)

    def wait_generation_idle(self, generation: int, timeout: float) -> bool:
        """Block until the generation has no sequences and no device jobs, or the timeout passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._generation_busy_locked(generation):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def cancel_generation(self, generation: int, reason: str) -> int:
        """Cancel every sequence of a generation (unload after the drain timeout). Returns how many."""
        with self._cond:
            seqs = [s for s in self._jobs if s.generation == generation]
            for seq in seqs:
                # ERROR + UNAVAILABLE tells a gateway to resume the stream on another board.
                self._book.cancel(seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, reason)
            self._cond.notify_all()
            return len(seqs)

    def quarantine_generation(self, rt: ModelRuntime, reason: str) -> bool:
        """Take a Ready generation out of service (Ready -> Quarantined): new requests are refused
        (UNAVAILABLE), its client jobs end ERROR + UNAVAILABLE (a gateway resumes them elsewhere),
        its parked KV is dropped; warm-up probes still run on it. Returns False, changing nothing,
        when it is not Ready."""
        with self._cond:
            if rt.state is not ModelState.READY:
                return False
            rt.lifecycle.move(ModelState.QUARANTINED)
            rt.message = f"quarantined: {reason}"
            self._book.drop_parked(f"model {rt.alias} quarantined")
            for seq in [s for s in self._jobs if s.generation == rt.generation and not s.internal]:
                self._book.cancel(
                    seq, FinishReason.ERROR, ErrorKind.UNAVAILABLE, f"model {rt.alias} quarantined: {reason}"
                )
            self._cond.notify_all()
            return True

    def replace_model(self, rt: ModelRuntime, model: ConfiguredModel) -> None:
        """A generation whose configuration a reset dropped was configured again: its jobs use the
        new handle from now on, and it warms up (Configuring -> Warming)."""
        with self._cond:
            rt.model = model
            rt.lifecycle.move(ModelState.WARMING)
            self._cond.notify_all()

    def settle_offset(self, rt: ModelRuntime, decision: OffsetDecision) -> None:
        """A warming generation serves with the features its load decided (`ModelRuntime.settle_offset`);
        without prefix reuse, a lane the offset check's probe left parked is dropped (its device
        lane queued for KV Free), so nothing is advertised or matched."""
        with self._cond:
            rt.settle_offset(decision)
            if not rt.prefix_reuse and rt.kv is not None:
                rt.kv.drop_parked()
            self._cond.notify_all()

    def move_generation(self, rt: ModelRuntime, state: ModelState) -> None:
        """Move a generation's model state under the engine lock (its clients' jobs are planned only
        while it is Ready or Draining), and wake the engine thread."""
        with self._cond:
            rt.lifecycle.move(state)
            self._cond.notify_all()

    def _generation_busy_locked(self, generation: int) -> bool:
        return any(s.generation == generation for s in self._jobs) or any(
            j.generation == generation for j in self._executor.jobs()
        )
