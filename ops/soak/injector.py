"""Planning calsim faults on a live board at job indices just ahead of its submit counter.

The daemon numbers every device submit attempt; `InjectFault` with no kind plans nothing and
returns the next index (`next_job_index`). `plan_on_board` reads it and plans `count` faults of
one kind `LEAD` attempts ahead, `spacing` apart (1: consecutive), moving on to the next index when
one is taken by an earlier plan or already passed (the pattern of tests/integration/
test_fault_soak.py `Chaos._plan_at`). Blocking: run it in a worker thread.
"""

from __future__ import annotations

from calculet.client import DaemonClient, InvalidArgument

LEAD = 2  # attempts ahead of the counter, so the plan arrives before the index is passed
MAX_TRIES = 16
TIMEOUT_S = 5.0


def plan_on_board(target: str, kind: str, count: int = 1, spacing: int = 1) -> list[int]:
    """Plan `count` faults of `kind` on the daemon at `target` (module docstring).

    Returns:
        The job indices planned (fewer than `count` only when `MAX_TRIES` indices were refused).

    Raises:
        CalculetError: the board cannot be reached, or refuses fault injection.
    """
    planned: list[int] = []
    with DaemonClient(target, timeout=TIMEOUT_S) as client:
        index = client.inject_fault().next_job_index + LEAD
        for _ in range(MAX_TRIES):
            if len(planned) == count:
                break
            try:
                client.inject_fault(kind, job_index=index)
                planned.append(index)
                index += spacing
            except InvalidArgument:  # taken by an earlier plan, or passed already
                # A burst under way stays together; a first fault may also jump to the counter again.
                index = index + 1 if planned else max(index + 1, client.inject_fault().next_job_index + LEAD)
    return planned
