"""`calctl up` without processes: usage errors (exit 2), the banner, an invalid package (exit 1),
the signal watch, and `make run`'s mapping onto `calctl up`."""

from __future__ import annotations

import json
import os
import shlex
import signal
from pathlib import Path

import pytest

from calculet.gateway.config import config_from, read_config
from calculet.gateway.fleet.catalog import CatalogModel
from calculet.ops import run_local
from calculet.ops.calctl import build_parser, main
from calculet.ops.commands.up import SignalWatch, banner, catalog_toml, fleet_config, switch_hint
from calculet.ops.fleet import GATEWAY_MODULE
from tests.unit.ops.calctl_fakes import usage_error

GOOD = ("up", "--boards", "2", "--preset", "tiny")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("up", "--preset", "tiny"), "--boards"),
        (("up", "--boards", "2"), "--preset"),
        ((*GOOD, "--models", "tiny,qwen3-4b"), "not allowed with argument --preset"),
        (("up", "--boards", "1", "--models", "tiny,llama"), "expected distinct presets"),
        (("up", "--boards", "1", "--models", "tiny,tiny"), "expected distinct presets"),
        (("up", "--boards", "0", "--preset", "tiny"), "between 1 and 64"),
        (("up", "--boards", "65", "--preset", "tiny"), "between 1 and 64"),
        (("up", "--boards", "two", "--preset", "tiny"), "expected an integer"),
        (("up", "--boards", "1", "--preset", "llama"), "invalid choice"),
        ((*GOOD, "--port", "0"), "between 1 and 65535"),
        ((*GOOD, "--port", "65536"), "between 1 and 65535"),
        ((*GOOD, "--port", "http"), "expected a port number"),
        ((*GOOD, "--time-scale", "-1"), "finite number >= 0"),
        ((*GOOD, "--time-scale", "nan"), "finite number >= 0"),
        ((*GOOD, "--time-scale", "fast"), "expected a number"),
        ((*GOOD, "--host", ""), "expected a host name"),
        ((*GOOD, "--policy", "greedy"), "invalid choice"),
        ((*GOOD, "--startup-timeout", "0"), "> 0"),
        ((*GOOD, "--verbose"), "unrecognized arguments"),
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], needle: str) -> None:
    assert needle in usage_error(capsys, *argv)


def test_defaults_and_the_fleet_they_describe() -> None:
    args = build_parser().parse_args([*GOOD])
    assert (args.port, args.host, args.time_scale, args.dir, args.policy) == (
        8000, "127.0.0.1", 1.0, Path("run"), "auto"
    )  # fmt: skip
    config = fleet_config(args)  # without the packages' defaults (test_serving_defaults.py): continuous
    assert (config.boards, config.model, config.package, config.workdir) == (2, "tiny", "tiny", Path("run"))
    argv = config.gateway_command("127.0.0.1:8000", ["unix:run/board0.sock"])
    assert argv[1:] == ["-m", GATEWAY_MODULE, "--listen", "127.0.0.1:8000", "--daemon", "unix:run/board0.sock"]


def test_all_options_parse() -> None:
    args = build_parser().parse_args(
        ["up", "--boards", "3", "--preset", "qwen3-30b-a3b", "--port", "9001", "--host", "0.0.0.0",
         "--time-scale", "0", "--dir", "/tmp/x", "--policy", "serial", "--startup-timeout", "30"]
    )  # fmt: skip
    config = fleet_config(args)
    assert (config.boards, config.model, config.port, config.host) == (3, "qwen3-30b-a3b", 9001, "0.0.0.0")
    assert (config.time_scale, config.policy, config.workdir, args.startup_timeout) == (
        0.0,
        "serial",
        Path("/tmp/x"),
        30,
    )


def test_help_lists_the_options_but_not_the_test_hook(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["up", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--boards", "--preset", "--port", "--host", "--time-scale", "--dir", "--policy"):
        assert option in out
    assert "--gateway-module" not in out


def test_banner_has_the_url_a_curl_and_an_openai_snippet() -> None:
    targets = ["unix:run/board0.sock", "unix:run/board1.sock"]
    text = banner("http://127.0.0.1:8123", "qwen3-30b-a3b", targets, Path("run/logs"), python="/venv/bin/python")
    lines = text.splitlines()
    assert "http://127.0.0.1:8123/v1" in lines[1]
    curl = next(i for i, line in enumerate(lines) if line.startswith("curl "))
    words = shlex.split(lines[curl].rstrip("\\") + " " + lines[curl + 1])
    assert words[2] == "http://127.0.0.1:8123/v1/chat/completions"
    body = json.loads(words[words.index("-d") + 1])
    assert body["model"] == "qwen3-30b-a3b" and body["max_tokens"] == 32
    assert body["messages"][0]["role"] == "user"
    start = lines.index("/venv/bin/python - <<'PY'")
    code = "\n".join(lines[start + 1 : lines.index("PY", start)])
    compile(code, "<banner>", "exec")  # pastes as it is: no indentation error
    assert "OpenAI(base_url='http://127.0.0.1:8123/v1', api_key='unused')" in code
    assert "model='qwen3-30b-a3b'" in code and "stream=True" in code and "delta.content" in code
    for t in targets:
        assert f"calctl status --daemon {t}" in text
    assert "run/logs/ (board0.log, board1.log, gateway.log)" in text
    assert "Ctrl-C" in text


def test_an_invalid_package_exits_1_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = tmp_path / "models" / "tiny"
    package.mkdir(parents=True)
    (package / "calculet-package.json").write_text("{}")
    code = main([*GOOD, "--dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "is invalid" in err
    assert not (tmp_path / "logs").exists()


def test_signal_watch_stop_then_hurry_and_handlers_restored() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)}
    with SignalWatch() as watch:
        assert not watch.stopping
        os.kill(os.getpid(), signal.SIGTERM)
        watch.wait(30)
        assert watch.stop_signal == signal.SIGTERM and not watch.hurry
        os.kill(os.getpid(), signal.SIGINT)
        watch.wait(30)
        assert watch.hurry
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_make_run_is_calctl_up_with_two_qwen_boards() -> None:
    args = run_local.build_parser().parse_args(["--dir", "somewhere", "--policy", "serial"])
    assert run_local.up_argv(args) == [
        "up", "--boards", "2", "--preset", "qwen3-30b-a3b", "--time-scale", "1", "--dir", "somewhere",
        "--policy", "serial",
    ]  # fmt: skip
    args = run_local.build_parser().parse_args(["--time-scale", "0"])
    assert run_local.up_argv(args)[6:8] == ["0", "--dir"]
    assert build_parser().parse_args(run_local.up_argv(args)).time_scale == 0.0


def test_several_models_start_the_boards_on_the_first_and_give_the_gateway_the_catalog(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["up", "--boards", "2", "--models", "qwen3-30b-a3b,qwen3-4b", "--dir", str(tmp_path)]
    )
    config = fleet_config(args)
    assert (config.model, config.package) == ("qwen3-30b-a3b", "qwen3-30b-a3b")
    assert config.gateway_args[:2] == ("--config", str(tmp_path / "gateway.toml"))
    path = tmp_path / "gateway.toml"
    path.write_text(catalog_toml(args.models))
    settings = {**read_config(path), "daemons": ["unix:run/board0.sock"]}  # the fleet's flags add the boards
    gateway = config_from(settings)
    assert gateway.catalog == (
        CatalogModel("qwen3-30b-a3b", "qwen3-30b-a3b", min_boards=1),
        CatalogModel("qwen3-4b", "qwen3-4b"),
    )
    assert gateway.placement == "demand"
    hint = switch_hint("qwen3-30b-a3b", ["qwen3-4b"], "unix:run/board0.sock")
    assert "calctl load qwen3-4b qwen3-4b --switch-from qwen3-30b-a3b@1 --daemon unix:run/board0.sock" in hint
    assert "Ask for one and the gateway" in hint
