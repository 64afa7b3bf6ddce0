"""`calculet-daemon`'s settings and ownership rules (issue 9), without a daemon process.

- Device options: `--device-option KEY=VALUE` (JSON values, raw strings, last wins, KEY=VALUE
  required), the `[daemon.device_options]` table, the shorthands `--time-scale`, `--fault-plan`,
  `--device-profile` (and their config keys), precedence flags > file, and any driver gets them.
- The runtime directory: flag > config (made absolute) > the host's fixed default
  (`$RUNTIME_DIRECTORY`, `$XDG_RUNTIME_DIR/calculet`, ...; `test_runtime_paths.py`), never `run/` in
  the working directory.
- `main`'s exit statuses: a driver refusing its options is a usage error (2, one line); a board whose
  lock is held elsewhere is EXIT_BOARD_BUSY (3) before the device is opened, and so is a device the
  driver reports held by another process (DeviceBusy).
- `ownership`: the board lock (pid written, exclusive, released), socket probing (absent, live,
  stale, not a socket), claiming a path (a stale socket removed, a live one or a file never), and
  removing the socket at shutdown only while it is still the one bound (inode check).
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calculet.common.errors import InvalidArgument
from calculet.daemon import main as daemon_main_module
from calculet.daemon import settings as daemon_settings_module
from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.device.errors import DeviceBusy
from calculet.daemon.main import EXIT_BOARD_BUSY, EXIT_USAGE
from calculet.daemon.main import main as daemon_main
from calculet.daemon.server.ownership import (
    BoardBusy,
    BoardLock,
    SocketIdentity,
    SocketInUse,
    SocketState,
    bind_unix,
    claim_socket_path,
    lock_path,
    probe_socket,
    remove_own_socket,
)
from calculet.daemon.settings import build_parser, config_from, merged_settings, parse_device_option, runtime_dir


def _config(argv: list[str]) -> DaemonConfig:
    return config_from(merged_settings(build_parser().parse_args(argv)))


def _toml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "daemon.toml"
    path.write_text(body, encoding="utf-8")
    return path


# ---- --device-option ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("n=4", ("n", 4)),
        ("x=0.5", ("x", 0.5)),
        ("x=1e3", ("x", 1000.0)),
        ("on=true", ("on", True)),
        ("off=false", ("off", False)),
        ("nothing=null", ("nothing", None)),
        ('p="a b"', ("p", "a b")),
        ("p=calsim-dev", ("p", "calsim-dev")),
        ("p=calrt-0.7.6", ("p", "calrt-0.7.6")),
        ("plan=plans/faults.json", ("plan", "plans/faults.json")),
        ("v=", ("v", "")),
        ("eq=a=b", ("eq", "a=b")),
        ("lead=01", ("lead", "01")),
        ("nan=NaN", ("nan", "NaN")),
        ("inf=Infinity", ("inf", "Infinity")),
        ('plan={"events": []}', ("plan", {"events": []})),
        ("list=[1, 2]", ("list", [1, 2])),
    ],
)
def test_a_device_option_value_is_json_when_it_parses_else_the_raw_string(spec: str, expected: tuple[str, Any]) -> None:
    assert parse_device_option(spec) == expected


@pytest.mark.parametrize("spec", ["novalue", "=1", "", " =x"])
def test_a_device_option_without_key_and_equals_is_refused(spec: str) -> None:
    with pytest.raises(InvalidArgument, match="KEY=VALUE"):
        parse_device_option(spec)


def test_device_options_reach_the_config_and_a_repeated_key_keeps_the_last() -> None:
    config = _config(
        ["--device-option", "dram_bytes=1024", "--device-option", "mode=fast", "--device-option", "dram_bytes=2048"]
    )
    assert config.device_options == {"dram_bytes": 2048, "mode": "fast"}


def test_no_device_options_by_default() -> None:
    # calsim's own defaults apply (time_scale 1.0, profile calrt-0.7.6): nothing is injected.
    assert _config([]).device_options == {}


def test_the_shorthand_flags_are_device_options() -> None:
    config = _config(["--time-scale", "0", "--fault-plan", "plans/f.json", "--device-profile", "calsim-dev"])
    assert config.device_options == {"time_scale": 0.0, "fault_plan": "plans/f.json", "profile": "calsim-dev"}


def test_the_device_options_table_and_its_inline_form(tmp_path: Path) -> None:
    table = _toml(tmp_path, '[daemon.device_options]\ndram_bytes = 4096\nprofile = "calsim-dev"\nfast = true\n')
    assert _config(["--config", str(table)]).device_options == {
        "dram_bytes": 4096,
        "profile": "calsim-dev",
        "fast": True,
    }
    inline = _toml(tmp_path, '[daemon]\ndevice-options = { time_scale = 0.5, fault_plan = "f.json" }\n')
    assert _config(["--config", str(inline)]).device_options == {"time_scale": 0.5, "fault_plan": "f.json"}


def test_the_config_shorthand_keys_are_device_options(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[daemon]\ntime-scale = 2\nfault_plan = "f.json"\ndevice-profile = "calsim-dev"\n')
    assert _config(["--config", str(path)]).device_options == {
        "time_scale": 2.0,
        "fault_plan": "f.json",
        "profile": "calsim-dev",
    }


def test_precedence_table_then_file_shorthands_then_option_flags_then_shorthand_flags(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        '[daemon]\ntime_scale = 2\ndevice_profile = "calsim-dev"\n'
        '[daemon.device_options]\ntime_scale = 3\nprofile = "from-table"\n'
        'dram_bytes = 1\nsram_bytes = 1\nkeep = "table"\n',
    )
    file_only = _config(["--config", str(path)])
    assert file_only.device_options == {
        "time_scale": 2.0,  # the file's shorthand key over its table
        "profile": "calsim-dev",
        "dram_bytes": 1,
        "sram_bytes": 1,
        "keep": "table",
    }
    flags = _config(
        ["--config", str(path), "--device-option", "dram_bytes=8", "--device-option", "time_scale=5",
         "--device-option", "profile=calrt-0.7.6", "--time-scale", "0"]
    )  # fmt: skip
    assert flags.device_options == {
        "time_scale": 0.0,  # --time-scale over --device-option time_scale over the file
        "profile": "calrt-0.7.6",  # --device-option over the file's device_profile
        "dram_bytes": 8,  # --device-option over the table
        "sram_bytes": 1,
        "keep": "table",
    }
    profile = _config(["--config", str(path), "--device-option", "profile=x", "--device-profile", "calsim-dev"])
    assert profile.device_options["profile"] == "calsim-dev"


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ("[daemon]\ndevice_options = 3\n", ["device_options"]),
        ('[daemon]\ndevice_options = "time_scale=0"\n', ["device_options"]),
        ('[daemon]\ntime_scale = "fast"\n', ["time_scale"]),
        ("[daemon]\ndevice_profile = 7\n", ["device_profile"]),
        ('[daemon]\ndevice_profile = ""\n', ["device_profile"]),
        ("[daemon]\ndevice_option = 1\n", ["device_option"]),
    ],
    ids=["table-int", "table-str", "time-scale-str", "profile-int", "profile-empty", "typo-key"],
)
def test_a_bad_device_options_setting_is_refused(tmp_path: Path, body: str, names: list[str]) -> None:
    with pytest.raises(InvalidArgument) as info:
        _config(["--config", str(_toml(tmp_path, body))])
    for name in names:
        assert name in str(info.value)


def test_config_from_folds_shorthand_keys_over_the_table() -> None:
    # Settings built by hand (not by `merged_settings`) may hold both.
    config = config_from({"device_options": {"time_scale": 9, "x": 1}, "time_scale": 0, "device_profile": "calsim-dev"})
    assert config.device_options == {"time_scale": 0.0, "x": 1, "profile": "calsim-dev"}


def test_device_options_reach_any_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon_settings_module, "available_drivers", lambda: ["calsim", "vendor"])
    config = _config(["--device", "vendor", "--device-option", "pcie=3", "--time-scale", "1"])
    assert (config.device, config.device_options) == ("vendor", {"pcie": 3, "time_scale": 1.0})


# ---- the runtime directory ----------------------------------------------------------------------


def test_the_runtime_dir_flag_then_config_then_the_hosts_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, '[daemon]\nruntime-dir = "/srv/calculet"\n')
    systemd = {"RUNTIME_DIRECTORY": "/run/calculet:/run/other", "XDG_RUNTIME_DIR": "/run/user/7"}
    from_flag = merged_settings(build_parser().parse_args(["--config", str(path), "--runtime-dir", "/tmp/x"]))
    assert runtime_dir(from_flag, systemd) == Path("/tmp/x")
    from_file = merged_settings(build_parser().parse_args(["--config", str(path)]))
    assert runtime_dir(from_file, systemd) == Path("/srv/calculet")
    none = merged_settings(build_parser().parse_args([]))
    assert runtime_dir(none, systemd) == Path("/run/calculet")
    assert runtime_dir(none, {"RUNTIME_DIRECTORY": "", "XDG_RUNTIME_DIR": "/run/user/7"}) == Path(
        "/run/user/7/calculet"
    )
    # Never relative: the default is fixed, and a relative flag is taken from the working directory.
    monkeypatch.chdir(tmp_path)
    assert runtime_dir(none, {}).is_absolute() and runtime_dir(none, {}) != tmp_path / "run"
    relative = merged_settings(build_parser().parse_args(["--runtime-dir", "rt"]))
    assert runtime_dir(relative, systemd) == tmp_path / "rt"
    with pytest.raises(InvalidArgument, match="runtime_dir"):
        runtime_dir({"runtime_dir": 5}, {})


# ---- main's exit statuses -----------------------------------------------------------------------


def _stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("calculet-daemon:")]


def test_a_driver_refusing_its_options_is_a_usage_error_and_frees_the_board(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--runtime-dir", str(tmp_path / "rt"), "--listen", f"unix:{tmp_path / 'd.sock'}", "--time-scale", "0"]
    assert daemon_main([*argv, "--device-option", "no_such_option=1"]) == EXIT_USAGE
    lines = _stderr_lines(capsys)
    assert len(lines) == 1 and "no_such_option" in lines[0] and "device_options" in lines[0], lines
    assert daemon_main([*argv, "--device-option", "dram_bytes=-1"]) == EXIT_USAGE
    lines = _stderr_lines(capsys)
    assert len(lines) == 1 and "dram_bytes" in lines[0], lines
    assert not (tmp_path / "d.sock").exists()
    BoardLock.acquire(tmp_path / "rt", 0).release()  # main released the board's lock


def test_a_malformed_device_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert daemon_main(["--device-option", "time_scale"]) == EXIT_USAGE
    lines = _stderr_lines(capsys)
    assert len(lines) == 1 and "KEY=VALUE" in lines[0], lines


def test_a_busy_board_exits_3_with_one_line_before_opening_the_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[int] = []
    monkeypatch.setattr(daemon_main_module, "open_device", lambda config: opened.append(config.board))
    with BoardLock.acquire(tmp_path, 2) as held:
        code = daemon_main(["--board", "2", "--runtime-dir", str(tmp_path), "--listen", f"unix:{tmp_path / 'b.sock'}"])
        assert held.held
    assert code == EXIT_BOARD_BUSY
    lines = _stderr_lines(capsys)
    assert len(lines) == 1, lines
    assert "board 2 is already served by pid" in lines[0] and str(lock_path(tmp_path, 2)) in lines[0]
    assert opened == []


def test_a_device_held_by_another_process_exits_3_with_one_line_and_frees_the_board(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def busy(config: DaemonConfig) -> None:
        raise DeviceBusy(f"calsim board {config.board} is already open in pid 4242 (device lock /x/board1.lock)")

    monkeypatch.setattr(daemon_main_module, "open_device", busy)
    argv = ["--board", "1", "--runtime-dir", str(tmp_path / "rt"), "--listen", f"unix:{tmp_path / 'b.sock'}"]
    assert daemon_main(argv) == EXIT_BOARD_BUSY
    lines = _stderr_lines(capsys)
    assert lines == [
        "calculet-daemon: failed_precondition: calsim board 1 is already open in pid 4242 (device lock /x/board1.lock)"
    ]
    assert not (tmp_path / "b.sock").exists()
    BoardLock.acquire(tmp_path / "rt", 1).release()  # main released the board's lock


# ---- the board lock -----------------------------------------------------------------------------


def test_the_board_lock_is_exclusive_names_its_holder_and_is_released(tmp_path: Path) -> None:
    runtime = tmp_path / "a" / "run"
    lock = BoardLock.acquire(runtime, 0)
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o750
    assert lock.path == lock_path(runtime, 0).absolute()
    assert lock.path.read_text() == f"{os.getpid()}\n"
    with pytest.raises(BoardBusy) as info:
        BoardLock.acquire(runtime, 0)  # flock: a second open file description conflicts, same process or not
    assert info.value.pid == os.getpid() and info.value.board == 0
    assert str(info.value) == f"board 0 is already served by pid {info.value.pid} (lock {lock.path})"
    BoardLock.acquire(runtime, 1).release()  # another board is another lock
    lock.release()
    lock.release()  # idempotent
    assert lock.path.exists() and lock.path.read_text() == ""  # the file stays; no stale pid
    BoardLock.acquire(runtime, 0).release()


def test_the_board_lock_refuses_an_unusable_runtime_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InvalidArgument, match="runtime_dir"):
        BoardLock.acquire(blocker, 0)
    with pytest.raises(InvalidArgument, match="runtime_dir"):
        BoardLock.acquire(blocker / "sub", 0)


# ---- Unix sockets -------------------------------------------------------------------------------


@pytest.fixture
def sock_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("s")  # short: AF_UNIX paths are limited to 107 bytes


@pytest.fixture
def listening(sock_dir: Path) -> Iterator[Path]:
    path = sock_dir / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        s.listen()
        yield path


def _stale(path: Path) -> Path:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # closed without unlink: what a killed daemon leaves
    return path


def test_probe_tells_absent_live_stale_and_not_a_socket(sock_dir: Path, listening: Path) -> None:
    assert probe_socket(sock_dir / "none.sock") is SocketState.ABSENT
    assert probe_socket(listening) is SocketState.LIVE
    assert probe_socket(_stale(sock_dir / "stale.sock")) is SocketState.STALE
    (sock_dir / "file.sock").write_text("x")
    assert probe_socket(sock_dir / "file.sock") is SocketState.NOT_SOCKET


def test_a_claim_removes_a_stale_socket_only(sock_dir: Path, listening: Path) -> None:
    stale = _stale(sock_dir / "stale.sock")
    claim_socket_path(stale)
    assert not stale.exists()
    claim_socket_path(sock_dir / "none.sock")  # nothing there: nothing to do
    with pytest.raises(SocketInUse, match="in use"):
        claim_socket_path(listening)
    assert probe_socket(listening) is SocketState.LIVE  # never unlinked
    regular = sock_dir / "file.sock"
    regular.write_text("keep")
    with pytest.raises(InvalidArgument, match="not a socket"):
        claim_socket_path(regular)
    assert regular.read_text() == "keep"


def _bind_listener(holder: list[socket.socket]) -> Any:
    def bind(path: Path) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))
        s.listen()
        holder.append(s)

    return bind


def test_bind_unix_publishes_the_socket_under_its_path_and_records_its_inode(sock_dir: Path) -> None:
    path = _stale(sock_dir / "d.sock")
    held: list[socket.socket] = []
    try:
        identity = bind_unix(path, _bind_listener(held))
        st = path.lstat()
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
        assert identity == SocketIdentity(st.st_dev, st.st_ino)
        assert probe_socket(path) is SocketState.LIVE
        assert [p.name for p in sock_dir.iterdir()] == ["d.sock"]  # the private bind name is gone
        with pytest.raises(SocketInUse):
            bind_unix(path, _bind_listener(held))
        assert path.lstat().st_ino == identity.ino
    finally:
        for s in held:
            s.close()


def test_the_socket_is_removed_at_shutdown_only_while_it_is_still_ours(sock_dir: Path) -> None:
    path = sock_dir / "d.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as ours:
        ours.bind(str(path))  # while bound, its inode cannot be reused by the replacement
        ours.listen()
        st = path.lstat()
        mine = SocketIdentity(st.st_dev, st.st_ino)
        path.unlink()  # replaced meanwhile: an operator removed it and another daemon bound the path
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
            other.bind(str(path))
            other.listen()
            assert remove_own_socket(path, mine) is False
            assert probe_socket(path) is SocketState.LIVE  # the other daemon's socket is left alone
            theirs = SocketIdentity(path.lstat().st_dev, path.lstat().st_ino)
            assert theirs != mine
    assert remove_own_socket(path, theirs) is True
    assert not path.exists()
    assert remove_own_socket(path, theirs) is False  # already gone


def test_the_reset_budget_is_configurable_by_flag_and_file(tmp_path: Path) -> None:
    assert (_config([]).reset_limit, _config([]).reset_window_s) == (3, 600.0)
    flagged = _config(["--reset-limit", "1", "--reset-window", "60"])
    assert (flagged.reset_limit, flagged.reset_window_s) == (1, 60.0)
    filed = _config(["--config", str(_toml(tmp_path, "[daemon]\nreset-limit = 0\nreset_window = 5\n"))])
    assert (filed.reset_limit, filed.reset_window_s) == (0, 5.0)
    for bad in (["--reset-limit", "-1"], ["--reset-window", "0"]):
        with pytest.raises(InvalidArgument):
            _config(bad)
