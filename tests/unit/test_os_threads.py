"""`os_threads`: a thread started with `named` carries its name in the kernel (Linux), which is how
`bench/host_cpu.py` splits the daemon's CPU by thread."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from calculet.daemon.os_threads import MAX_NAME_BYTES, named

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernel thread names are Linux's")


def _comm_of_thread(name: str) -> str:
    seen: list[str] = []

    def body() -> None:
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    thread = threading.Thread(target=named(name, body))
    thread.start()
    thread.join(timeout=10)
    assert seen, "the thread did not run"
    return seen[0]


def test_a_named_thread_has_its_kernel_name() -> None:
    assert _comm_of_thread("calsim-worker") == "calsim-worker"


def test_a_long_name_is_cut_to_the_kernels_limit() -> None:
    assert _comm_of_thread("calculet-completion") == "calculet-completion"[:MAX_NAME_BYTES]


def test_the_caller_keeps_its_own_name() -> None:
    before = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text()
    _comm_of_thread("other")
    assert Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text() == before
