"""How the supervisor starts a worker: the interface (`WorkerLauncher`, `WorkerProcess`) and the real
one (`ExecLauncher`), which runs the gateway again as a new process.

A worker is `python -m calculet.gateway.main` with the supervisor's own arguments, then
`--workers N` (the count the supervisor runs, whatever the config file says by then) and the hidden
`--worker-index I --worker-fds LISTEN,PRIVATE --worker-dir DIR`: it inherits the shared listening
socket and its private socket as those descriptors (`pass_fds`). A fresh interpreter, not a fork:
the supervisor has imported grpcio, whose at-fork handlers break a forked child (common/parent_death.py),
and subprocess spawns with vfork + exec when no preexec_fn is given. Its environment names the
supervisor's notify socket (`$NOTIFY_SOCKET`, `notify.NotifyReceiver`) and the supervisor's pid
(`parent_death.PARENT_PID_ENV`): the worker asks the kernel for SIGTERM when the supervisor dies, so
a supervisor killed outright (SIGKILL, `calctl up` gone) leaves no worker behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path

from calculet.common.parent_death import PARENT_PID_ENV

GATEWAY_MODULE = "calculet.gateway.main"
# Only the supervisor talks to systemd's watchdog and notify socket; workers talk to the supervisor.
SUPERVISOR_ONLY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class WorkerProcess(ABC):
    """A started worker."""

    @property
    @abstractmethod
    def pid(self) -> int:
        """Its process id (what its notifications are sent from)."""

    @abstractmethod
    async def wait(self) -> int:
        """Wait until it exits; its exit status (negative: killed by that signal)."""

    @abstractmethod
    def terminate(self) -> None:
        """Ask it to stop (SIGTERM: it finishes running requests first); nothing if it has exited."""

    @abstractmethod
    def kill(self) -> None:
        """Stop it now (SIGKILL); nothing if it has exited."""


class WorkerLauncher(ABC):
    """Starts the worker of one index."""

    @abstractmethod
    async def start(self, index: int) -> WorkerProcess:
        """Start worker `index`.

        Raises:
            OSError: the process could not be started.
        """


def worker_argv(argv: Sequence[str], count: int, index: int, fds: tuple[int, int], run_dir: Path) -> list[str]:
    """The command line of worker `index`: the gateway module with the supervisor's `argv`, then the
    worker flags (later flags win over earlier ones and over the config file)."""
    return [
        sys.executable, "-m", GATEWAY_MODULE, *argv,
        "--workers", str(count),
        "--worker-index", str(index),
        "--worker-fds", f"{fds[0]},{fds[1]}",
        "--worker-dir", str(run_dir),
    ]  # fmt: skip


class _Process(WorkerProcess):
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def wait(self) -> int:
        return await self._proc.wait()

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # exited, not reaped yet
                self._proc.send_signal(sig)


class ExecLauncher(WorkerLauncher):
    """Runs each worker as `python -m calculet.gateway.main ...` (module docstring).

    Args:
        argv: the supervisor's own arguments.
        count: the workers the supervisor runs.
        run_dir: the supervisor's private directory.
        listen_fd: the shared listening socket's descriptor.
        private_fds: each worker's private socket's descriptor, by index.
        notify_address: the supervisor's notify socket (`$NOTIFY_SOCKET` of every worker).
        environ: the environment the workers' starts from (default `os.environ`).
    """

    def __init__(
        self,
        argv: Sequence[str],
        count: int,
        run_dir: Path,
        listen_fd: int,
        private_fds: Sequence[int],
        notify_address: str,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._argv = list(argv)
        self._count = count
        self._run_dir = run_dir
        self._listen_fd = listen_fd
        self._private_fds = list(private_fds)
        base = {k: v for k, v in (os.environ if environ is None else environ).items() if k not in SUPERVISOR_ONLY_ENV}
        self._env = {**base, "NOTIFY_SOCKET": notify_address, PARENT_PID_ENV: str(os.getpid())}

    async def start(self, index: int) -> WorkerProcess:
        fds = (self._listen_fd, self._private_fds[index])
        argv = worker_argv(self._argv, self._count, index, fds, self._run_dir)
        proc = await asyncio.create_subprocess_exec(*argv, pass_fds=fds, env=self._env)
        return _Process(proc)
