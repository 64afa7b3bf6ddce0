"""OS names for the daemon's threads, so per-thread CPU is readable from outside the process.

Python 3.11 names threads only inside the interpreter; `top -H`, `/proc/PID/task/TID/comm` and
psutil see every thread of the daemon as "python". `named(name, target)` wraps a thread's target so
the thread first sets its kernel name (`PR_SET_NAME`, at most 15 bytes) and then runs. The host-CPU
benchmark (`bench/host_cpu.py`) reads those names to split the daemon's CPU by thread: the engine,
the completion thread, calsim's worker (the emulated device, which a real board runs on the board)
and the rest. Anywhere but Linux, or if prctl is missing, names stay as they were.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

_PR_SET_NAME = 15
MAX_NAME_BYTES = 15  # the kernel's limit, without the terminating NUL


def set_os_thread_name(name: str) -> bool:
    """Name the calling thread in the kernel. Returns whether it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    raw = name.encode("ascii", "replace")[:MAX_NAME_BYTES]
    zero = ctypes.c_ulong(0)
    return int(prctl(ctypes.c_int(_PR_SET_NAME), ctypes.c_char_p(raw), zero, zero, zero)) == 0


def named(name: str, target: Callable[[], None]) -> Callable[[], None]:
    """`target`, run by a thread that first takes `name` as its OS name."""

    def run() -> None:
        set_os_thread_name(name)
        target()

    return run
