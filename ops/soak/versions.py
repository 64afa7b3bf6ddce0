"""What ran: the package version, Python, the host's CPUs, and the repository's commit when the
code runs from a git checkout (two quick `git` calls; None otherwise)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

GIT_TIMEOUT_S = 10.0


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "host_cpus": os.cpu_count()}
    try:
        out["calculet"] = importlib.metadata.version("calculet")
    except importlib.metadata.PackageNotFoundError:
        out["calculet"] = None
    repo = Path(__file__).resolve().parents[2]
    out["commit"] = _git(repo, "rev-parse", "HEAD")
    status = _git(repo, "status", "--porcelain") if out["commit"] else None
    out["dirty"] = None if status is None else bool(status)
    return out


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
