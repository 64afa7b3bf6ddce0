"""Typed errors of the core bookkeeping that callers need to tell apart from other failures."""

from __future__ import annotations

from calculet.common.errors import FailedPrecondition, Unavailable


class StaleGeneration(FailedPrecondition):
    """An object of one model generation reached a component of another (generation fencing):
    a completion from an old generation must never write into the new generation's state. A job
    context of an older buffer epoch offered to its pool raises it too (epoch fencing, `job_buffers.py`)."""


class BoardHalted(Unavailable):
    """The board is halted (waiting for an operator reset, or lost): it runs no job and configures no
    package until the halt lifts (docs/daemon.md, "Device memory")."""


class MemoryNotBack(FailedPrecondition):
    """A reset left the device holding memory above its baseline (what it held when opened plus what
    each configured model took): a halt stays until a reset proves the memory back."""
