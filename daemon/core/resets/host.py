"""`ResetHost`: what the reset controller (`controller.py`) may ask of the engine, and nothing
more. The engine builds one from its `Bookkeeper`'s methods and a few of its own, so the controller
reaches the job and lane bookkeeping through these callables alone, never through the engine's
fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from calculet.daemon.core.executor import DeviceJob, PoolUpkeep
from calculet.daemon.core.resets.budget import ResetTally
from calculet.daemon.core.runtime import ModelRuntime


@dataclass(frozen=True)
class ResetHost:
    """The engine's job and lane bookkeeping a reset may ask for: the engine hands over exactly these,
    and the controller touches nothing else of it. Every one but `run_upkeep` is called with the
    engine lock held.

    Attributes:
        drop_parked: drop every parked lane of the board, giving the reason (no parked KV is trusted
            after a reset or a fault).
        give_up_job: a device job is given up (device lost, or no reset may collect it): its lanes
            become UNKNOWN and its sequences fail with the message; its buffers stay with the device.
        fail_unplaced: fail, with the message, every job not in a device job (the board halted).
        serving_generations: "alias@generation" of every published, serving generation (the audit).
        generation_count: how many generations exist (not yet unloaded).
        configured: the generations holding a configured model whose jobs may run, oldest first.
        configuration_lost: a reset dropped this generation's configuration: its jobs lose their KV
            (the sequences it hits go in the tally) and it goes back to Configuring if it was Ready.
            Returns whether it must be configured and warmed again.
        job_generation_runs: the device job's generation still runs (so its buffer pool is live).
        run_upkeep: a pool's device work (rebuild after a quarantine), without the lock.
    """

    drop_parked: Callable[[str], None]
    give_up_job: Callable[[DeviceJob, str], None]
    fail_unplaced: Callable[[str], None]
    serving_generations: Callable[[], tuple[str, ...]]
    generation_count: Callable[[], int]
    configured: Callable[[], list[ModelRuntime]]
    configuration_lost: Callable[[ModelRuntime, str, ResetTally], bool]
    job_generation_runs: Callable[[DeviceJob], bool]
    run_upkeep: Callable[[PoolUpkeep | None], None]
