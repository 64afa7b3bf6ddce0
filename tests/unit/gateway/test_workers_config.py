"""`workers`: the `[gateway]` key and `--workers` flag (1 by default, 1..64, a whole number), the
worker's hidden flags, and `main` refusing a bad value with one line and status 2 before any
process or server exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.common.errors import InvalidArgument
from calculet.gateway import main as gateway_main
from calculet.gateway.config import MAX_WORKERS, GatewayConfig, config_from, read_config
from calculet.gateway.main import build_parser, settings_from, worker_from
from calculet.gateway.workers.identity import WorkerIdentity


def _toml(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text('[gateway]\ndaemons = ["unix:a"]\n' + table, encoding="utf-8")
    return path


def _from_args(argv: list[str]) -> GatewayConfig:
    return config_from(settings_from(build_parser().parse_args(argv)))


def test_one_worker_by_default_more_by_file_or_flag(tmp_path: Path) -> None:
    assert _from_args(["--daemon", "unix:a"]).workers == 1
    assert config_from(read_config(_toml(tmp_path, "workers = 4\n"))).workers == 4
    assert _from_args(["--config", str(_toml(tmp_path, "workers = 4\n")), "--workers", "2"]).workers == 2
    assert config_from(read_config(_toml(tmp_path, f"workers = {MAX_WORKERS}.0\n"))).workers == MAX_WORKERS


@pytest.mark.parametrize("value", ["0", "-1", str(MAX_WORKERS + 1), '"2"', "2.5", "true"])
def test_a_bad_workers_value_is_refused_naming_the_key(tmp_path: Path, value: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        config_from(read_config(_toml(tmp_path, f"workers = {value}\n")))
    assert str(info.value).startswith("workers:"), str(info.value)


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> int:
        raise AssertionError("main started the gateway")

    monkeypatch.setattr(gateway_main, "serve_with_workers", refuse)
    monkeypatch.setattr(gateway_main.uvicorn, "Server", refuse)


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["--daemon", "unix:a", "--workers", "0"], "workers"),
        (["--daemon", "unix:a", "--workers", "65"], "workers"),
        (["--daemon", "unix:a", "--workers", "2", "--worker-index", "0"], "--worker-index"),
        (
            [
                "--daemon",
                "unix:a",
                "--workers",
                "2",
                "--worker-index",
                "2",
                "--worker-fds",
                "3,4",
                "--worker-dir",
                "/x",
            ],
            "--worker-index",
        ),
    ],
)
def test_main_refuses_bad_worker_settings_with_one_line(
    nothing_starts: None, capsys: pytest.CaptureFixture[str], argv: list[str], key: str
) -> None:
    assert gateway_main.main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("calculet-gateway: ") and key in lines[0]


def test_bad_worker_descriptors_are_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:  # argparse: status 2
        build_parser().parse_args(["--daemon", "unix:a", "--worker-fds", "3"])
    assert info.value.code == 2


def test_the_hidden_flags_make_the_worker_identity(tmp_path: Path) -> None:
    worker_flags = ["--worker-index", "1", "--worker-fds", "3,4", "--worker-dir", str(tmp_path)]
    args = build_parser().parse_args(["--daemon", "unix:a", "--workers", "3", *worker_flags])
    worker = worker_from(args, config_from(settings_from(args)))
    assert worker == WorkerIdentity(1, 3, tmp_path)
    assert args.worker_fds == (3, 4)
    assert worker.siblings == (0, 2) and worker.socket_of(2) == tmp_path / "worker-2.sock"
    plain = build_parser().parse_args(["--daemon", "unix:a", "--workers", "3"])
    assert worker_from(plain, config_from(settings_from(plain))) is None


def test_the_hidden_flags_stay_out_of_the_help() -> None:
    text = build_parser().format_help()
    assert "--workers" in text and "--worker-index" not in text and "--worker-fds" not in text
