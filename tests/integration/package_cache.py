"""The session's calsim packages, built once for all pytest-xdist workers.

Building qwen3-30b-a3b derives Qwen3's BPE merges (about 4 s of CPU); every worker used to pay it.
`session_packages` builds the packages once under a file lock in the directory the workers' temp
dirs share, and each worker copies them (11 MB) into a models root of its own, so what one test
module adds or changes there stays within its worker, as before.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

COMPLETE = ".complete"


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temp dir every worker of this run sees (this process's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def session_packages(tmp_path_factory: pytest.TempPathFactory, build: Callable[[Path], None]) -> Path:
    """A private copy of the packages `build(root)` writes, built by the first worker to ask."""
    shared = shared_dir(tmp_path_factory)
    cache = shared / "models-cache"
    with (shared / "models-cache.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (cache / COMPLETE).exists():
            shutil.rmtree(cache, ignore_errors=True)  # a worker that failed mid-build left a part
            cache.mkdir()
            build(cache)
            (cache / COMPLETE).touch()
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(cache, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns(COMPLETE))
    return root
