"""The fault schedule: one cycle, repeated, in which every fault kind happens once.

The cycle is a tenth of the run (`cycle_length`: at least `MIN_CYCLE_S`), so the run's first and
last tenth see the same mix of faults and their latencies compare (`drift`). A cycle raised above
a tenth (a floor) is stretched so that the run holds a whole number of them (`whole_cycle`): the
last span of `drift` is then the last cycle, and the first span holds the first cycle's faults.
The last cycle puts its faults on the boards the first cycle did, so the two spans compare like
for like: the same kinds, on the same boards, at the same offsets. Inside a cycle the
kinds (`CYCLE`) sit at evenly spread offsets, slot k at `(k + 0.5) x cycle / kinds`; the kinds that
may take a board out of service (`DISRUPTIVE`: a SIGKILL, a lost device, a submit-error streak
that drains the board, a rollout, and the bursts the daemon escalates) are played one at a time
(`chaos`), so the other board carries the traffic. Per-board faults rotate over the boards from
one cycle to the next (but the last, above), except that the faults that end a process
(`RESTARTING`) spare the last board: it lives through the run, so a daemon's growth over hours is
judged too.

| kind | what is done | what the daemon does |
| --- | --- | --- |
| `ccu_exception` | one `ccu_exception` | the job's sequences re-prefill |
| `ccu_burst` | `CCU_BURST` on consecutive job indices | re-prefill; an automatic CCU reset where the daemon escalates |
| `nan_logits` | one `nan_logits` | re-prefill |
| `nan_burst` | `NAN_BURST`, `NAN_SPACING` jobs apart | re-prefill; quarantine + golden re-check where it escalates |
| `submit_error` | one `submit_error` | the submit is retried |
| `submit_streak` | `SUBMIT_STREAK` consecutive | the board drains itself; the harness resumes it |
| `hang` | one `hang` | a CCU reset after `--job-timeout` |
| `device_lost` | one `device_lost` | the board halts (or exits 75); the harness restarts it |
| `sigkill` | SIGKILL of the board's process | the harness restarts it (systemd's Restart=) |
| `rollout` | `calctl rollout` to the other copy of the package | board by board: drain, load, resume |
| `model_switch` | switch the board to model B, send a burst of B | drain, unload, load B; placement switches it back |

`model_switch` is in the cycle only on a `--models A,B` fleet of 2 or more boards (`cycle_kinds`):
the gateway keeps A on at least one board.

Pure: `plan_faults` returns the whole schedule; `chaos` plays it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum


class SoakFault(Enum):
    """A fault kind of the cycle (module docstring)."""

    CCU_EXCEPTION = "ccu_exception"
    CCU_BURST = "ccu_burst"
    NAN_LOGITS = "nan_logits"
    NAN_BURST = "nan_burst"
    SUBMIT_ERROR = "submit_error"
    SUBMIT_STREAK = "submit_streak"
    HANG = "hang"
    DEVICE_LOST = "device_lost"
    SIGKILL = "sigkill"
    ROLLOUT = "rollout"
    MODEL_SWITCH = "model_switch"


CCU_BURST = 3
NAN_BURST = 2  # the daemon's quarantine threshold; a third could hit the golden re-check itself
NAN_SPACING = 2
SUBMIT_STREAK = 5  # the daemons run with --submit-error-streak 5
# A cycle holds six faults that take a board out for seconds each, one at a time (`chaos`), so it
# is not shorter than this.
MIN_CYCLE_S = 120.0
DISRUPTIVE = frozenset(
    {
        SoakFault.SIGKILL,
        SoakFault.DEVICE_LOST,
        SoakFault.SUBMIT_STREAK,
        SoakFault.ROLLOUT,
        SoakFault.CCU_BURST,  # may escalate to a CCU reset
        SoakFault.NAN_BURST,  # may escalate to a quarantine and a golden re-check
        SoakFault.MODEL_SWITCH,  # the board serves the other model until placement switches it back
    }
)
FLEET_WIDE = frozenset({SoakFault.ROLLOUT})
# Faults that end a board's process. They never hit the last board (with 2 or more), so one daemon
# lives through the whole run and its RSS, fd and thread growth is judged, not only the gateway's.
RESTARTING = frozenset({SoakFault.SIGKILL, SoakFault.DEVICE_LOST})
# One cycle's order: no two faults that take a board out next to each other where it can be helped.
CYCLE: tuple[SoakFault, ...] = (
    SoakFault.CCU_EXCEPTION,
    SoakFault.SIGKILL,
    SoakFault.NAN_LOGITS,
    SoakFault.SUBMIT_STREAK,
    SoakFault.CCU_BURST,
    SoakFault.SUBMIT_ERROR,
    SoakFault.ROLLOUT,
    SoakFault.HANG,
    SoakFault.DEVICE_LOST,
    SoakFault.NAN_BURST,
)
# On a `--models A,B` fleet: last, after the NaN burst, so a cycle still starts with a fault that
# takes no board out.
SWITCH_CYCLE: tuple[SoakFault, ...] = (*CYCLE, SoakFault.MODEL_SWITCH)
# Automatic resets a cycle may cause on one board: a hang, a CCU burst's escalation, a lost
# device's reset attempt, a NaN burst's quarantine; the daemons' budget is sized from it.
RESETS_PER_CYCLE = 4


def cycle_kinds(switching: bool, boards: int) -> tuple[SoakFault, ...]:
    """One cycle's kinds: `SWITCH_CYCLE` when the fleet has a second model to switch to and a
    second board to keep the first on, else `CYCLE`."""
    return SWITCH_CYCLE if switching and boards >= 2 else CYCLE


def cycle_length(duration_s: float) -> float:
    """A tenth of the run, at least `MIN_CYCLE_S`, stretched to divide the run (`whole_cycle`)."""
    return whole_cycle(duration_s, max(duration_s / 10.0, MIN_CYCLE_S))


def whole_cycle(duration_s: float, cycle_s: float) -> float:
    """`cycle_s` stretched (never shortened) so that `duration_s` holds a whole number of cycles, at
    least one: `duration_s / floor(duration_s / cycle_s)`."""
    if not (duration_s > 0 and cycle_s > 0):
        raise ValueError(f"fault cycle: needs a positive duration and cycle, got {duration_s}, {cycle_s}")
    return duration_s / max(1, math.floor(duration_s / cycle_s + 1e-9))


@dataclass(frozen=True)
class PlannedFault:
    """One fault of the schedule.

    Attributes:
        at_s: seconds into the soak phase.
        kind: what.
        board: the board it targets (None: the fleet, a rollout).
        cycle: which cycle (0-based).
    """

    at_s: float
    kind: SoakFault
    board: int | None
    cycle: int


def plan_faults(
    duration_s: float, boards: int, cycle_s: float | None = None, kinds: tuple[SoakFault, ...] = CYCLE
) -> list[PlannedFault]:
    """Every fault of a run of `duration_s` seconds, in time order (module docstring).

    Args:
        duration_s: the soak phase's length.
        boards: boards in the fleet (per-board kinds rotate over them).
        cycle_s: the cycle's length (default `cycle_length(duration_s)`).
        kinds: one cycle's kinds, in order.

    Raises:
        ValueError: a duration, cycle or board count that is not positive, or no kinds.
    """
    cycle = cycle_length(duration_s) if cycle_s is None else cycle_s
    if not duration_s > 0 or not cycle > 0 or boards < 1 or not kinds:
        raise ValueError(f"fault plan: needs positive duration, cycle and boards and some kinds, got {duration_s}")
    slot = cycle / len(kinds)
    last = math.ceil(duration_s / cycle - 1e-9) - 1
    out = []
    number = 0
    while number * cycle < duration_s:
        turn = 0 if number == last else number  # the last cycle repeats the first one's boards
        for k, kind in enumerate(kinds):
            at = number * cycle + (k + 0.5) * slot
            if at >= duration_s:
                break
            board = None if kind in FLEET_WIDE else (turn + k) % _targets(kind, boards)
            out.append(PlannedFault(at, kind, board, number))
        number += 1
    return out


def _targets(kind: SoakFault, boards: int) -> int:
    """How many boards (from board 0) `kind` rotates over: all, or all but the survivor."""
    return boards - 1 if kind in RESTARTING and boards > 1 else boards


def reset_budget(cycle_s: float) -> tuple[int, float]:
    """The daemons' `--reset-limit` and `--reset-window` for this cycle: a window of one cycle, with
    twice the automatic resets a cycle can cause on one board plus two, so the plan never exhausts
    it (an exhausted budget is then a finding, not noise)."""
    return 2 * RESETS_PER_CYCLE + 2, cycle_s
