"""`calctl up --daemon-arg / --gateway-arg` and `FleetConfig.gateway_args` without processes: the
extra flags reach every daemon's and the gateway's command line after the fleet's own, in order;
every bad value is a usage error (exit 2) naming what is wrong."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from calculet.ops.calctl import build_parser, main
from calculet.ops.commands.up import fleet_config
from calculet.ops.fleet import GATEWAY_MODULE, FleetConfig, LocalFleet
from tests.unit.ops.calctl_fakes import usage_error

GOOD = ("up", "--boards", "2", "--preset", "tiny")


def test_extra_flags_reach_every_daemon_and_the_gateway_in_order(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [*GOOD, "--dir", str(tmp_path), "--daemon-arg", "--prefix-reuse on", "--gateway-arg=--routing=prefix",
         "--daemon-arg=--prefix-min-tokens=64", "--gateway-arg", "--log-level DEBUG"]
    )  # fmt: skip
    config = fleet_config(args)
    assert config.daemon_args == ("--prefix-reuse", "on", "--prefix-min-tokens=64")
    assert config.gateway_args == ("--routing=prefix", "--log-level", "DEBUG")
    fleet = LocalFleet(config)
    for board in range(2):
        argv = fleet.daemon_argv(board)
        assert argv[-3:] == ["--prefix-reuse", "on", "--prefix-min-tokens=64"]
        assert argv.index("--policy") < argv.index("--prefix-reuse")  # after the fleet's own flags
    assert fleet.gateway.argv == [
        sys.executable, "-m", GATEWAY_MODULE, "--listen", "127.0.0.1:8000",
        "--daemon", fleet.targets[0], "--daemon", fleet.targets[1], "--routing=prefix", "--log-level", "DEBUG",
    ]  # fmt: skip


def test_without_extra_flags_nothing_is_added(tmp_path: Path) -> None:
    config = fleet_config(build_parser().parse_args([*GOOD, "--dir", str(tmp_path)]))
    assert config.daemon_args == () and config.gateway_args == ()
    fleet = LocalFleet(config)
    assert fleet.daemon_argv(0)[-2:] == ["--policy", "continuous"]
    assert fleet.gateway.argv[-2:] == ["--daemon", fleet.targets[1]]


def test_gateway_args_follow_an_injected_gateway_command(tmp_path: Path) -> None:
    config = FleetConfig(
        workdir=tmp_path, boards=1, model="tiny", package="tiny",
        gateway_command=lambda listen, daemons: ["stand-in", listen], gateway_args=("--routing", "load"),
    )  # fmt: skip
    assert LocalFleet(config).gateway.argv == ["stand-in", "127.0.0.1:8000", "--routing", "load"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--daemon-arg", ""), "argument --daemon-arg: '': expected daemon flags"),
        (("--daemon-arg", "   "), "expected daemon flags"),
        (("--daemon-arg", "on"), "argument --daemon-arg: 'on': expected daemon flags, starting with '--'"),
        (("--daemon-arg", "--log-level 'DEBUG"), "No closing quotation"),
        (("--daemon-arg", "--time-scale 0"), "--time-scale is set by calctl up itself for every daemon"),
        (("--daemon-arg=--policy=serial",), "--policy is set by calctl up itself"),
        (("--daemon-arg", "--log-level DEBUG --model x=y"), "--model is set by calctl up itself"),
        (("--daemon-arg", "--listen unix:x.sock"), "--listen is set by calctl up itself for every daemon"),
        (("--gateway-arg", "--daemon unix:x.sock"), "--daemon is set by calctl up itself for every gateway"),
        (("--gateway-arg=--listen=0.0.0.0:1",), "--listen is set by calctl up itself for every gateway"),
        (("--gateway-arg", "routing"), "expected gateway flags, starting with '--'"),
        (("--daemon-arg",), "expected one argument"),
    ],
)
def test_bad_extra_flags_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], needle: str
) -> None:
    assert needle in usage_error(capsys, *GOOD, *argv)


def test_help_shows_the_extra_flag_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["up", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--daemon-arg FLAGS" in out and "--gateway-arg FLAGS" in out
