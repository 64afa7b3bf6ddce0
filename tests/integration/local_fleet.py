"""`local_fleet`: real daemons and a real gateway over them, serving, for the gateway's integration
tests (each module starts its own, shares it between its tests, and stops it at the end)."""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess


@contextmanager
def local_fleet(
    root: Path, models_root: Path, boards: Sequence[list[str]], gateway_args: Sequence[str] = ()
) -> Iterator[tuple[list[DaemonProcess], GatewayProcess]]:
    """Daemons (`boards`: each one's arguments) and a gateway over them, under `root`, serving: the
    daemons SERVING, the gateway ready with every board up. On the way out each is stopped, and the
    log of one that did not exit cleanly is printed."""
    daemons = []
    for i, args in enumerate(boards):
        (root / f"d{i}").mkdir()
        daemons.append(DaemonProcess(root / f"d{i}", models_root, args))
    (root / "gw").mkdir()
    gateway = GatewayProcess(root / "gw", [*(flag for d in daemons for flag in ("--daemon", d.target)), *gateway_args])
    try:
        for d in daemons:
            d.wait_serving()
        gateway.wait_up(ready=True)
        gateway.wait_until(lambda body: set(body["boards"].values()) == {"up"}, "every board up")
        yield daemons, gateway
    finally:
        for proc in (gateway, *daemons):
            code = proc.stop()
            if code not in (0, -signal.SIGTERM):
                print(f"---- log of {proc.workdir} (exit {code}) ----\n{proc.log()}")
