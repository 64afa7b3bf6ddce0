"""`die_with_parent`: a child started by `calctl up` asks the kernel for SIGTERM when its parent exits
(set by the child itself, so the parent can spawn without a preexec_fn and never fork() under gRPC)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")

# A middle process starts a grandchild that calls die_with_parent naming the middle one, waits until
# it is armed, then exits: the kernel must SIGTERM the grandchild, which would otherwise sleep 60 s.
MIDDLE = """
import os, subprocess, sys
env = {**os.environ, "CALCULET_PARENT_PID": str(os.getpid())}
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env, stdout=subprocess.PIPE)
print(child.pid, flush=True)
assert child.stdout.readline() == b"armed\\n"
"""
GRANDCHILD = """
import os, time
from calculet.common.parent_death import PARENT_PID_ENV, die_with_parent
assert die_with_parent()
assert PARENT_PID_ENV not in os.environ, "not passed on to our own children"
print("armed", flush=True)
time.sleep(60)
"""
# Without the variable nothing is set, and the call says so.
UNNAMED = """
from calculet.common.parent_death import die_with_parent
assert die_with_parent({"OTHER": "1"}) is False
print("ok")
"""


def test_a_child_gets_sigterm_when_the_parent_that_named_itself_exits() -> None:
    middle = subprocess.run(
        [sys.executable, "-c", MIDDLE, GRANDCHILD], capture_output=True, text=True, timeout=60, check=True
    )
    grandchild = int(middle.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # gone, or a zombie until whoever adopted it reaps it
        if not alive(grandchild):
            return
        time.sleep(0.05)
    os.kill(grandchild, 9)
    pytest.fail(f"grandchild {grandchild} outlived its parent")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_without_the_variable_nothing_is_set() -> None:
    out = subprocess.run([sys.executable, "-c", UNNAMED], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "ok"
