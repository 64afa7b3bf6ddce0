"""Importing the client stays light: nothing of the daemon (engine, sampler, wire module, emulator) and no numpy.

The gateway imports `calculet.client` in every worker; the daemon's modules (and numpy with them)
must not come along. A fresh interpreter is needed because this test process has imported them.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "numpy",
    "calculet.daemon",  # all of it: the client shares only calculet.common with the daemon (issue 32)
    "calculet.daemon.core",
    "calculet.daemon.sampling",
    "calculet.daemon.wire",
    "calculet.daemon.calsim",
    "calculet.daemon.server",
    "calculet.daemon.device",
    "calculet.daemon.package",
)

PROBE = f"""
import json, sys
import calculet.client
from calculet.client import AsyncDaemonClient, DaemonClient, SamplingParams, TokenChunk, FinalEvent
heavy = {HEAVY!r}
print(json.dumps(sorted(m for m in sys.modules if m in heavy or m.startswith(tuple(h + "." for h in heavy)))))
"""


def test_importing_the_client_imports_neither_the_daemon_nor_numpy() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == [], "calculet.client must not import these"
