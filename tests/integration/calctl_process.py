"""Running the real `calctl` (as `python -m calculet.ops.calctl`) in the calctl integration tests,
and the one-line-on-stderr check for its refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

CALCTL_DEADLINE_S = 120.0


def run_calctl(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = CALCTL_DEADLINE_S
) -> subprocess.CompletedProcess[str]:
    """calctl with `args`; the environment is this process's without CALCULET_* variables, plus `env`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CALCULET_")}
    cmd = [sys.executable, "-m", "calculet.ops.calctl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env={**base, **(env or {})}, timeout=timeout)


def one_calctl_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    """A refusal: exit 1, nothing on stdout, exactly one `calctl:` line on stderr (no traceback)
    naming `words`."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("calctl:")]
    assert proc.returncode == 1 and len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "", proc.stdout
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]
