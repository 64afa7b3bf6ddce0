"""A rollout as an operator runs it: `calctl rollout ALIAS PACKAGE --gateway URL` in a process of
its own, output to `<out>/logs/rollout-<n>.log`, with `--drain-timeout DRAIN_S` (long enough for a
board's running requests to finish, the other board taking the new ones), `--interrupt` (what is
still running then ends and the gateway resumes it on the other board) and `--rejoin-timeout
REJOIN_S`.

Its package alternates between the preset's two identical directories (`fleets.prepare_packages`),
so the answers stay those of the reference. The subprocess is spawned without a `preexec_fn`
(grpcio is loaded in this process: docs/operations.md, "Start-up").
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from calculet.ops.fleet import read_tail

DRAIN_S = 60.0
REJOIN_S = 120.0


@dataclass(frozen=True)
class RolloutResult:
    """How a rollout ended: its exit status and the last lines of its output."""

    package: str
    returncode: int
    log: Path
    tail: str


async def run_rollout(alias: str, package: str, gateway_url: str, log: Path) -> RolloutResult:
    """Run one rollout to its end (module docstring)."""
    argv = [
        sys.executable, "-m", "calculet.ops.calctl", "rollout", alias, package,
        "--gateway", gateway_url, "--interrupt",
        "--drain-timeout", f"{DRAIN_S:g}", "--rejoin-timeout", f"{REJOIN_S:g}",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALCULET_")}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT, env=env
        )
        try:
            code = await proc.wait()
        except asyncio.CancelledError:
            proc.terminate()
            await proc.wait()
            raise
    return RolloutResult(package, code, log, read_tail(log, lines=3))
