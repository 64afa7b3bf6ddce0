"""The host's default runtime directory: where board locks live unless `--runtime-dir` names a place.

A board's lock belongs to the board, not to the working directory a daemon was started from, so the
default is a fixed absolute place (issue 21), the first of:

1. `$RUNTIME_DIRECTORY` (its first entry): systemd's `RuntimeDirectory=calculet` sets it,
   `/run/calculet` for a system unit, `$XDG_RUNTIME_DIR/calculet` for a user unit;
2. `$XDG_RUNTIME_DIR/calculet`: the login session's private runtime directory;
3. `/run/calculet`, when this user may write there (it is a writable directory, or it is missing
   and `/run` is writable);
4. `/tmp/calculet-<uid>`: a per-user fallback, refused unless it is missing or a directory (not a
   symlink) owned by this user.

A relative value of either variable is ignored, as the XDG base directory specification says.
calsim keeps its device locks in `<this directory>/calsim` (`calculet.daemon.calsim.device_lock`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from calculet.common.errors import InvalidArgument

APP_DIR = "calculet"
RUN_ROOT = Path("/run")
TMP_ROOT = Path("/tmp")  # the fallback in it is checked before use
SYSTEMD_ENV = "RUNTIME_DIRECTORY"
XDG_ENV = "XDG_RUNTIME_DIR"


def default_runtime_dir(
    environ: Mapping[str, str] = os.environ,
    *,
    run_root: Path = RUN_ROOT,
    tmp_root: Path = TMP_ROOT,
    uid: int | None = None,
) -> Path:
    """The first of the places in the module docstring; always absolute, never created here.

    Args:
        environ: the variables to read.
        run_root, tmp_root: `/run` and `/tmp` (tests point them elsewhere).
        uid: the user of the fallback (default: this process's).

    Raises:
        InvalidArgument: the fallback is needed and `<tmp_root>/calculet-<uid>` is something other
            than this user's own directory (another user's, a symlink, a file).
    """
    systemd = environ.get(SYSTEMD_ENV, "").split(":")[0]
    if os.path.isabs(systemd):
        return Path(systemd)
    xdg = environ.get(XDG_ENV, "")
    if os.path.isabs(xdg):
        return Path(xdg) / APP_DIR
    system = run_root / APP_DIR
    if _may_write(system):
        return system
    user = os.getuid() if uid is None else uid
    fallback = tmp_root / f"{APP_DIR}-{user}"
    _check_private(fallback, user)
    return fallback


def _may_write(path: Path) -> bool:
    if path.is_dir():
        return os.access(path, os.W_OK | os.X_OK)
    return not os.path.lexists(path) and os.access(path.parent, os.W_OK | os.X_OK)


def _check_private(path: Path, uid: int) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InvalidArgument(f"runtime_dir: cannot inspect {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise InvalidArgument(
            f"runtime_dir: {path} is not a directory owned by uid {uid}; set --runtime-dir or ${XDG_ENV}"
        )
