"""`serve_with_workers`: the `calculet-gateway` process when `workers` > 1, from its sockets to its exit.

It binds the listening socket (`sockets.bind_listener`) and one private Unix socket per worker in a
new private directory (0700, under `$TMPDIR`), creates the workers' notify socket there, runs the
`WorkerSupervisor` over `ExecLauncher` workers on an asyncio loop (SIGTERM and SIGINT stop it), and at the
end closes the sockets, removes the listening socket's file (a Unix one it bound) and the directory.
It serves no HTTP itself.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path

from calculet.common.sd_notify import Notifier
from calculet.gateway.config import GatewayConfig
from calculet.gateway.workers.identity import worker_socket
from calculet.gateway.workers.launcher import ExecLauncher
from calculet.gateway.workers.notify import NotifyReceiver
from calculet.gateway.workers.sockets import Listener, bind_listener, bind_unix
from calculet.gateway.workers.supervisor import WorkerSupervisor

log = logging.getLogger("calculet.gateway.workers")

EXIT_NO_LISTEN = 3  # what uvicorn exits with when it cannot bind (the one-process gateway's status)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def serve_with_workers(cfg: GatewayConfig, argv: Sequence[str]) -> int:
    """Run `cfg.workers` workers on `cfg.listen` until SIGTERM or SIGINT.

    Args:
        cfg: the checked settings.
        argv: this process's arguments, given again to every worker.
    Returns:
        The exit status: 0 stopped, 1 workers kept failing to start, 3 the address cannot be bound.
    """
    run_dir = Path(tempfile.mkdtemp(prefix="calculet-gateway-"))
    sockets: list[Listener] = []
    notifier = Notifier.from_environ()
    receiver: NotifyReceiver | None = None
    try:
        try:
            sockets.append(Listener(bind_listener(cfg.listen)))
        except OSError as err:
            log.error("cannot listen on %s: %s", cfg.listen, err)
            return EXIT_NO_LISTEN
        sockets += [Listener(bind_unix(worker_socket(run_dir, i))) for i in range(cfg.workers)]
        receiver = NotifyReceiver(run_dir / "notify.sock")
        fds = [s.fileno() for s in sockets]
        launcher = ExecLauncher(argv, cfg.workers, run_dir, fds[0], fds[1:], receiver.address)
        log.info("gateway on %s: %d workers (run directory %s)", cfg.listen, cfg.workers, run_dir)
        return asyncio.run(_supervise(WorkerSupervisor(launcher, cfg.workers, notifier=notifier), receiver))
    finally:
        if receiver is not None:
            receiver.close()
        for sock in sockets:
            sock.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        notifier.close()


async def _supervise(supervisor: WorkerSupervisor, receiver: NotifyReceiver) -> int:
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, supervisor.stop)
    receiver.attach(loop, supervisor.worker_message)
    try:
        return await supervisor.run()
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
