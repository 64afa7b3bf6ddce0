"""Gateway settings: the `[gateway]` TOML table, flags over it, every value checked (naming the key),
and `main` refusing a bad setting with one line and status 2, before any server exists."""

from __future__ import annotations

import asyncio
import gc
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from calculet.common.errors import InvalidArgument
from calculet.gateway import main as gateway_main
from calculet.gateway.config import GatewayConfig, config_from, read_config
from calculet.gateway.main import build_parser, service_factory, settings_from, uvicorn_config
from calculet.gateway.routing.policy import RoutingMode


def _toml(tmp_path: Path, body: str, name: str = "gateway.toml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def _from_toml(tmp_path: Path, table: str) -> GatewayConfig:
    return config_from(read_config(_toml(tmp_path, "[gateway]\n" + table)))


def _from_args(argv: list[str]) -> GatewayConfig:
    return config_from(settings_from(build_parser().parse_args(argv)))


def test_toml_table_with_dashes_and_underscores(tmp_path: Path) -> None:
    cfg = _from_toml(
        tmp_path,
        """
listen = "0.0.0.0:9000"
daemons = ["unix:/run/b0.sock", "unix:/run/b1.sock"]
dns = ["boards.svc:50051"]
dns_interval = 2.5
load-interval-ms = 200
max_attempts = 3
failover-wait = 0
log_level = "debug"
""",
    )
    assert cfg.listen == "0.0.0.0:9000"
    assert cfg.daemons == ("unix:/run/b0.sock", "unix:/run/b1.sock")
    assert cfg.dns == ("boards.svc:50051",)
    assert (cfg.dns_interval_s, cfg.load_interval_ms, cfg.max_attempts, cfg.failover_wait_s) == (2.5, 200, 3, 0.0)
    assert cfg.log_level == "DEBUG"


def test_defaults_apply_to_missing_keys(tmp_path: Path) -> None:
    cfg = _from_toml(tmp_path, 'daemons = "unix:/run/b0.sock"\n')
    assert cfg.daemons == ("unix:/run/b0.sock",)  # one string is one target
    assert cfg == GatewayConfig(daemons=("unix:/run/b0.sock",))


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        """[gateway]
listen = "127.0.0.1:1"
daemons = ["unix:/from/file.sock"]
dns-interval = 30
max-attempts = 3
""",
    )
    cfg = _from_args(["--config", str(path), "--max-attempts", "9", "--daemon", "unix:a", "--daemon", "unix:b"])
    assert cfg.max_attempts == 9
    assert cfg.daemons == ("unix:a", "unix:b")  # flag lists replace the file's
    assert cfg.dns_interval_s == 30.0 and cfg.listen == "127.0.0.1:1"  # not given as flags: the file's
    cfg = _from_args(["--config", str(path), "--listen", "unix:/tmp/gw.sock", "--log-level", "warning"])
    assert cfg.listen == "unix:/tmp/gw.sock" and cfg.daemons == ("unix:/from/file.sock",)
    assert cfg.log_level == "WARNING"


def test_flags_alone() -> None:
    cfg = _from_args(["--dns", "boards:50051", "--dns-interval", "0.5", "--failover-wait", "2"])
    assert (cfg.daemons, cfg.dns, cfg.dns_interval_s, cfg.failover_wait_s) == ((), ("boards:50051",), 0.5, 2.0)


def test_unknown_keys_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="max-atempts"):
        _from_toml(tmp_path, 'daemons = ["unix:a"]\nmax_atempts = 3\n')


@pytest.mark.parametrize(
    "body, match",
    [
        ('daemons = ["unix:a"]\n', "gateway"),  # no [gateway] table
        ('[gateway]\ndaemons = ["unix:a"\n', "gateway.toml"),  # not TOML
        ('gateway = "x"\n', "gateway"),  # [gateway] is not a table
    ],
)
def test_a_file_without_a_valid_gateway_table_is_refused(tmp_path: Path, body: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        read_config(_toml(tmp_path, body))


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"nope\.toml"):
        read_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    "line, key",
    [
        ('dns-interval = "ten"', "dns-interval"),
        ("max-attempts = true", "max-attempts"),
        ('max_attempts = "3"', "max-attempts"),
        ("max-attempts = 2.5", "max-attempts"),
        ("load-interval-ms = 100.5", "load-interval-ms"),
        ("failover-wait = [1]", "failover-wait"),
        ("listen = 8000", "listen"),
        ('listen = ""', "listen"),
        ("daemons = 5", "daemons"),
        ('daemons = ["unix:a", 5]', "daemons"),
        ('daemons = ["unix:a", ""]', "daemons"),
        ("dns = {name = 1}", "dns"),
        ("log-level = 3", "log-level"),
        ('log-level = "LOUD"', "log-level"),
        ("dns-interval = nan", "dns-interval"),
        ("failover-wait = inf", "failover-wait"),
        ("routing = 1", "routing"),
        ('routing = "fastest"', "routing"),
        ('routing = "PREFIX"', "routing"),
        ('answer-memory-tokens = "1000"', "answer-memory-tokens"),
        ("answer-memory-tokens = 10.5", "answer-memory-tokens"),
    ],
)
def test_wrong_types_are_refused_naming_the_key(tmp_path: Path, line: str, key: str) -> None:
    table = line + "\n" + ("" if line.startswith(("daemons", "dns ")) else 'daemons = ["unix:a"]\n')
    with pytest.raises(InvalidArgument) as info:
        _from_toml(tmp_path, table)
    assert str(info.value).startswith(key + ":"), str(info.value)


@pytest.mark.parametrize(
    "line, key",
    [
        ("dns-interval = 0", "dns-interval"),
        ("dns-interval = 86401", "dns-interval"),
        ("load-interval-ms = 49", "load-interval-ms"),
        ("load-interval-ms = 60001", "load-interval-ms"),
        ("max-attempts = 0", "max-attempts"),
        ("max-attempts = 101", "max-attempts"),
        ("failover-wait = -1", "failover-wait"),
        ("failover-wait = 3601", "failover-wait"),
        ("answer-memory-tokens = -1", "answer-memory-tokens"),
        ("answer-memory-tokens = 2147483649", "answer-memory-tokens"),
    ],
)
def test_out_of_range_is_refused_naming_the_key(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        _from_toml(tmp_path, line + '\ndaemons = ["unix:a"]\n')
    assert str(info.value).startswith(key + ":"), str(info.value)


def test_bounds_are_inclusive(tmp_path: Path) -> None:
    cfg = _from_toml(
        tmp_path, 'daemons = ["unix:a"]\ndns-interval = 0.1\nload-interval-ms = 60000\nmax-attempts = 100\n'
    )
    assert (cfg.dns_interval_s, cfg.load_interval_ms, cfg.max_attempts) == (0.1, 60000, 100)


def test_no_boards_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="no boards"):
        _from_toml(tmp_path, 'listen = "127.0.0.1:8000"\n')
    with pytest.raises(InvalidArgument, match="no boards"):
        _from_toml(tmp_path, "daemons = []\ndns = []\n")
    with pytest.raises(InvalidArgument, match="no boards"):
        _from_args([])


# uvicorn_config ------------------------------------------------------------------------------


def test_idle_connections_outlive_the_clients_pools() -> None:
    """A client's pool must close an idle connection before the gateway does, or a request sent on
    it as the gateway closes it breaks with no response (httpx and the openai SDK expire at 5 s)."""
    config = uvicorn_config(GatewayConfig(listen="unix:/tmp/calculet-gw.sock", daemons=("unix:a",)))
    pool_expiry = httpx.Limits().keepalive_expiry
    assert pool_expiry is not None and config.timeout_keep_alive > 10 * pool_expiry


def test_unix_listen_gives_uds() -> None:
    config = uvicorn_config(GatewayConfig(listen="unix:/tmp/calculet-gw.sock", daemons=("unix:a",)))
    assert config.uds == "/tmp/calculet-gw.sock"


@pytest.mark.parametrize(
    "listen, host, port", [("127.0.0.1:8123", "127.0.0.1", 8123), ("[::1]:9000", "::1", 9000), ("gw:0", "gw", 0)]
)
def test_tcp_listen_gives_host_and_port(listen: str, host: str, port: int) -> None:
    config = uvicorn_config(GatewayConfig(listen=listen, daemons=("unix:a",)))
    assert (config.host, config.port, config.uds) == (host, port, None)


@pytest.mark.parametrize("listen", ["localhost", "localhost:", "host:http", "host:70000", "host:-1", "8000"])
def test_bad_listen_is_refused(listen: str) -> None:
    with pytest.raises(InvalidArgument, match="listen"):
        uvicorn_config(GatewayConfig(listen=listen, daemons=("unix:a",)))


# main ----------------------------------------------------------------------------------------


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    class Refuse:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("main started a server")

    monkeypatch.setattr(gateway_main.uvicorn, "Server", Refuse)


@pytest.mark.parametrize(
    "argv, key",
    [
        (["--daemon", "unix:a", "--max-attempts", "0"], "max-attempts"),
        (["--daemon", "unix:a", "--listen", "nowhere"], "listen"),
        (["--daemon", "unix:a", "--log-level", "chatty"], "log-level"),
        (["--daemon", "unix:a", "--dns-interval", "nan"], "dns-interval"),
        ([], "no boards"),
    ],
)
def test_main_refuses_a_bad_setting_with_one_line(
    no_server: None, capsys: pytest.CaptureFixture[str], argv: list[str], key: str
) -> None:
    assert gateway_main.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("calculet-gateway: ") and key in lines[0]


def test_main_refuses_a_bad_config_file(no_server: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _toml(tmp_path, '[gateway]\ndaemons = ["unix:a"]\nlisten_port = 1\n')
    assert gateway_main.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "listen-port" in err


def test_a_whole_float_is_an_integer(tmp_path: Path) -> None:
    cfg = _from_toml(tmp_path, 'daemons = ["unix:a"]\nload-interval-ms = 1e3\nmax-attempts = 4.0\n')
    assert (cfg.load_interval_ms, cfg.max_attempts) == (1000, 4)
    assert isinstance(cfg.load_interval_ms, int) and isinstance(cfg.max_attempts, int)


def test_routing_prefix_by_default_load_by_file_or_flag(tmp_path: Path) -> None:
    assert _from_args(["--daemon", "unix:a"]).routing is RoutingMode.PREFIX
    assert _from_toml(tmp_path, 'daemons = ["unix:a"]\nrouting = "load"\n').routing is RoutingMode.LOAD
    path = _toml(tmp_path, '[gateway]\ndaemons = ["unix:a"]\nrouting = "load"\n')
    assert _from_args(["--config", str(path), "--routing", "prefix"]).routing is RoutingMode.PREFIX
    assert _from_args(["--daemon", "unix:a", "--routing", "load"]).routing is RoutingMode.LOAD
    with pytest.raises(SystemExit):  # argparse refuses other values (exit status 2)
        build_parser().parse_args(["--daemon", "unix:a", "--routing", "fastest"])


def test_answer_memory_tokens_by_default_file_or_flag(tmp_path: Path) -> None:
    assert _from_args(["--daemon", "unix:a"]).answer_memory_tokens == 0, "off unless asked for"
    assert _from_toml(tmp_path, 'daemons = ["unix:a"]\nanswer_memory_tokens = 7\n').answer_memory_tokens == 7
    path = _toml(tmp_path, '[gateway]\ndaemons = ["unix:a"]\nanswer-memory-tokens = 0\n')
    assert _from_args(["--config", str(path), "--answer-memory-tokens", "500"]).answer_memory_tokens == 500
    with pytest.raises(SystemExit):  # argparse refuses a non-integer (exit status 2)
        build_parser().parse_args(["--daemon", "unix:a", "--answer-memory-tokens", "lots"])


@pytest.mark.parametrize("tokens", [0, 1234])
def test_the_service_owns_an_answer_memory_of_the_configured_size(tokens: int) -> None:
    async def scenario() -> None:
        cfg = GatewayConfig(daemons=("unix:/nonexistent/board0.sock",), answer_memory_tokens=tokens)
        try:
            async with asynccontextmanager(service_factory(cfg))() as service:
                assert service.answers.max_tokens == tokens and service.answers.enabled == (tokens > 0)
        finally:
            gc.unfreeze()  # the factory freezes start-up objects, as a gateway process should

    asyncio.run(scenario())


CATALOG_TABLE = '\n[gateway.models.qwen]\npackage = "qwen"\n'


def test_placement_is_off_by_default_and_demand_reads_its_bounds(tmp_path: Path) -> None:
    off = _from_toml(tmp_path, 'daemons = ["unix:/b"]\n' + CATALOG_TABLE)
    assert off.placement == "off" and off.placement_bounds.max_waiting == 64 and off.placement_policy.idle_ttl_s == 300
    on = _from_toml(
        tmp_path,
        'daemons = ["unix:/b"]\nplacement = "demand"\nplacement-queue = 8\nplacement_wait = 30\n'
        "min-residency = 10\nidle-ttl = 0\n" + CATALOG_TABLE,
    )
    assert on.placement == "demand"
    assert (on.placement_bounds.max_waiting, on.placement_bounds.wait_s) == (8, 30.0)
    assert (on.placement_policy.min_residency_s, on.placement_policy.idle_ttl_s) == (10.0, 0.0)
    flags = _from_args(["--config", str(_toml(tmp_path, "[gateway]\n" + CATALOG_TABLE)), "--daemon", "unix:/b",
                        "--placement", "demand", "--placement-wait", "5"])  # fmt: skip
    assert flags.placement == "demand" and flags.placement_bounds.wait_s == 5.0


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ('placement = "eager"' + CATALOG_TABLE, "placement: one of off, demand"),
        ('placement = "demand"', "needs a model catalog"),
        ("placement-queue = 0" + CATALOG_TABLE, "placement-queue"),
        ("placement-wait = 0" + CATALOG_TABLE, "placement-wait"),
        ("min-residency = -1" + CATALOG_TABLE, "min-residency"),
        ('daemon-operate-token-file = "/nonexistent/token"' + CATALOG_TABLE, "daemon-operate-token-file"),
    ],
)
def test_bad_placement_settings_are_refused_naming_the_key(tmp_path: Path, table: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        _from_toml(tmp_path, 'daemons = ["unix:/b"]\n' + table)
