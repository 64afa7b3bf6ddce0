"""Die with the parent that started us: the child half of `calctl up`'s process supervision.

`calctl up` (`calculet.ops.fleet`) starts daemons and a gateway and wants them gone if it dies
without cleaning up (SIGKILL, a crash). On Linux, `PR_SET_PDEATHSIG` asks the kernel to send a
signal when the parent exits. The parent used to set it in a `preexec_fn`, but a `preexec_fn` makes
`subprocess` fork() instead of vfork(), and fork() runs grpcio's at-fork handlers: the forked child
restarts gRPC's poller thread, `close_fds` closes that poller's epoll fd before exec, and the child
aborts (`ev_epoll1_linux.cc: epoll_wait error: Bad file descriptor`, SIGABRT) before it ever
becomes a gateway or daemon (grpc/grpc#43055). So the parent only names itself in the child's
environment (`PARENT_PID_ENV`), spawns without a `preexec_fn` (vfork: no at-fork handlers), and the
child sets the death signal itself as the first thing it does, then checks that its parent is still
the one that started it (a parent that died in between would never send it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_PID_ENV = "CALCULET_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(environ: dict[str, str] | None = None) -> bool:
    """If the environment names a parent pid, have the kernel send SIGTERM when that parent exits,
    and SIGTERM ourselves now if it already has. The variable is removed, so our own children do not
    inherit it.

    Args:
        environ: the environment to read (default `os.environ`).

    Returns:
        Whether the death signal was set.
    """
    env = os.environ if environ is None else environ
    parent = env.pop(PARENT_PID_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    sig = ctypes.c_ulong(int(signal.SIGTERM))
    if prctl(ctypes.c_int(_PR_SET_PDEATHSIG), sig, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        return False
    if os.getppid() != int(parent):  # the parent died before prctl: nobody will signal us
        os.kill(os.getpid(), signal.SIGTERM)
    return True
