"""calsim holds its board as a real runtime holds its device node (issue 21, `calsim/device_lock.py`).

- A second process opening a board this process holds gets DeviceBusy (FAILED_PRECONDITION) naming
  this pid and the lock file; another board, or the same board after `close`, opens.
- Opens within one process share the hold: the board is free only after the last one closes.
- The kernel drops the hold of a process that dies (SIGKILL); a forked child inherits none.
- Where the locks live: the `state_dir` option, else `$CALSIM_STATE_DIR`, else `calsim/` in the
  host's default runtime directory; a malformed option is refused before anything is held.

Other processes are real ones: `python -c` running `_OPENER` against the same state directory.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from calculet.common.errors import ErrorKind
from calculet.daemon.calsim.device_lock import STATE_DIR_ENV, hold_board, state_dir
from calculet.daemon.device.errors import DeviceBusy, InvalidJob
from calculet.daemon.runtime_paths import default_runtime_dir

from .conftest import OpenDevice

DEADLINE_S = 60.0
# Opens `board` in `state_dir` and reports "open" (then holds it until stdin closes) or "busy: <message>".
_OPENER = """
import sys
from calculet.daemon.calsim.device import CalsimDriver
from calculet.daemon.device.errors import DeviceBusy
board, state_dir, hold = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "hold"
try:
    device = CalsimDriver().open(board, {"time_scale": 0, "state_dir": state_dir})
except DeviceBusy as exc:
    print(f"busy: {exc.kind.value}: {exc}", flush=True)
    sys.exit(0)
print("open", flush=True)
if hold:
    sys.stdin.read()
device.close()
"""


def _other_process(board: int, directory: Path) -> str:
    """What another process gets when it opens `board` (and closes it at once)."""
    argv = [sys.executable, "-c", _OPENER, str(board), str(directory), "close"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_another_process_is_refused_until_the_board_is_closed(tmp_path: Path, open_device: OpenDevice) -> None:
    first = open_device(0, state_dir=str(tmp_path))
    lock = tmp_path / "board0.lock"
    assert lock.read_text() == f"{os.getpid()}\n"
    assert _other_process(0, tmp_path) == (
        f"busy: failed_precondition: calsim board 0 is already open in pid {os.getpid()} (device lock {lock})"
    )
    assert _other_process(1, tmp_path) == "open"  # another board is another lock
    second = open_device(0, state_dir=str(tmp_path))  # this process: a second, independent board 0
    first.close()
    assert _other_process(0, tmp_path).startswith("busy:")  # still held by `second`
    second.close()
    second.close()  # idempotent: the count is not decremented twice
    assert lock.read_text() == ""  # no stale pid
    assert _other_process(0, tmp_path) == "open"
    open_device(0, state_dir=str(tmp_path)).close()


def test_the_state_directory_is_created_private(tmp_path: Path, open_device: OpenDevice) -> None:
    directory = tmp_path / "a" / "calsim"
    open_device(2, state_dir=str(directory))
    assert stat.S_IMODE(directory.stat().st_mode) == 0o750
    assert (directory / "board2.lock").read_text() == f"{os.getpid()}\n"


def test_a_killed_holder_frees_the_board(tmp_path: Path, open_device: OpenDevice) -> None:
    argv = [sys.executable, "-c", _OPENER, "0", str(tmp_path), "hold"]
    holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(DeviceBusy, match=f"already open in pid {holder.pid} ") as info:
            open_device(0, state_dir=str(tmp_path))
        assert info.value.kind is ErrorKind.FAILED_PRECONDITION
        holder.send_signal(signal.SIGKILL)
        assert holder.wait(timeout=DEADLINE_S) == -signal.SIGKILL
        open_device(0, state_dir=str(tmp_path))  # the kernel dropped the dead process's lock
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=DEADLINE_S)
        if holder.stdout is not None:
            holder.stdout.close()
        if holder.stdin is not None:
            holder.stdin.close()


def _hold_in_child(directory: str, result: multiprocessing.SimpleQueue[str]) -> None:
    try:
        hold_board(Path(directory), 0)
    except DeviceBusy as exc:
        result.put(f"busy: {exc}")
    else:
        result.put("open")


def test_a_forked_child_does_not_inherit_the_hold(tmp_path: Path) -> None:
    hold = hold_board(tmp_path, 0)
    try:
        ctx = multiprocessing.get_context("fork")
        result: multiprocessing.SimpleQueue[str] = ctx.SimpleQueue()
        child = ctx.Process(target=_hold_in_child, args=(str(tmp_path), result))
        child.start()
        child.join(DEADLINE_S)
        assert child.exitcode == 0
        assert result.get() == f"busy: calsim board 0 is already open in pid {os.getpid()} (device lock {hold.path})"
    finally:
        hold.release()
    assert not hold.held


def test_where_the_locks_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = {STATE_DIR_ENV: "rel", "XDG_RUNTIME_DIR": "/run/user/7"}
    assert state_dir(Path("/opt/x"), env) == Path("/opt/x")  # the option wins
    assert state_dir(Path("opt"), env) == tmp_path / "opt"  # made absolute
    assert state_dir(None, env) == tmp_path / "rel"
    assert state_dir(None, {"XDG_RUNTIME_DIR": "/run/user/7"}) == Path("/run/user/7/calculet/calsim")
    assert state_dir(None, {"RUNTIME_DIRECTORY": "/run/calculet"}) == Path("/run/calculet/calsim")
    assert state_dir(None, {}) == default_runtime_dir({}) / "calsim"


@pytest.mark.parametrize("value", [5, "", ["a"]])
def test_a_malformed_state_dir_is_refused_before_anything_is_held(
    tmp_path: Path, open_device: OpenDevice, value: object
) -> None:
    with pytest.raises(InvalidJob, match="state_dir"):
        open_device(0, state_dir=value)
