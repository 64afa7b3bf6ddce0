"""Process usage: least-squares slopes, growth between the first and last spans, and which
processes are judged."""

from __future__ import annotations

import contextlib
import socket

import psutil
import pytest

from calculet.ops.soak.growth import MIB, GrowthBounds, ProcessSeries, UsageSample, series_growth, slope_per_hour
from calculet.ops.soak.sampler import inbound_connections


def series(values: list[tuple[float, int, int, int]], ended: bool = False, name: str = "gateway") -> ProcessSeries:
    s = ProcessSeries(name, "gateway" if name == "gateway" else "daemon", 42, ended=ended)
    s.samples = [UsageSample(t, rss, fds, threads) for t, rss, fds, threads in values]
    return s


def test_slope_per_hour_is_least_squares() -> None:
    assert slope_per_hour([(0.0, 1.0), (1800.0, 2.0), (3600.0, 3.0)]) == pytest.approx(2.0)
    assert slope_per_hour([(0.0, 5.0), (3600.0, 4.0), (7200.0, 6.0)]) == pytest.approx(0.5)
    assert slope_per_hour([(1.0, 1.0)]) is None
    assert slope_per_hour([(1.0, 1.0), (1.0, 2.0)]) is None


def flat_then(late_fds: int, late_rss: int, duration: float = 1200.0) -> ProcessSeries:
    early = [(float(t), 100 * MIB, 30, 10) for t in range(0, 300, 10)]
    late = [(float(t), late_rss, late_fds, 10) for t in range(300, int(duration) + 1, 10)]
    return series(early + late)


def test_growth_within_bounds_passes_and_beyond_fails() -> None:
    ok = series_growth(flat_then(46, 150 * MIB), 60.0, 1200.0, GrowthBounds())
    assert ok["fds"].growth == 16 and ok["fds"].judged and not ok["fds"].over
    assert not ok["rss_bytes"].over  # +50 MiB: under the 64 MiB floor
    bad = series_growth(flat_then(47, 170 * MIB), 60.0, 1200.0, GrowthBounds())
    assert bad["fds"].over and bad["rss_bytes"].over
    assert bad["fds"].slope_per_hour is not None and bad["fds"].slope_per_hour > 0


def test_rss_bound_is_ten_percent_of_a_large_process() -> None:
    assert GrowthBounds().limit("rss_bytes", 2000 * MIB) == pytest.approx(200 * MIB)
    assert GrowthBounds().limit("rss_bytes", 100 * MIB) == 64 * MIB


def test_growth_is_reported_but_not_judged_on_short_runs_or_replaced_processes() -> None:
    short = series_growth(flat_then(99, 100 * MIB, duration=500.0), 30.0, 500.0, GrowthBounds())
    assert short["fds"].growth == 69 and not short["fds"].judged and not short["fds"].over
    gone = flat_then(99, 100 * MIB)
    gone.ended = True
    assert not series_growth(gone, 60.0, 1200.0, GrowthBounds())["fds"].judged
    late = series([(float(t), MIB, 99, 1) for t in range(100, 1201, 10)], name="board0")
    assert not series_growth(late, 60.0, 1200.0, GrowthBounds())["fds"].judged  # started after the warm-up


def test_a_backlogs_inbound_connections_are_not_judged_as_fds_but_a_leak_is() -> None:
    """The gateway holds one socket per request in flight: a backlog in the last span raises its fds
    and its inbound connections alike, and only what is left beyond them is judged."""
    early = [UsageSample(float(t), 100 * MIB, 30, 10, 3) for t in range(0, 300, 10)]
    backlog = [UsageSample(float(t), 100 * MIB, 30 + 200, 10, 3 + 200) for t in range(300, 1201, 10)]
    busy = ProcessSeries("gateway", "gateway", 42, samples=early + backlog)
    judged = series_growth(busy, 60.0, 1200.0, GrowthBounds())["fds"]
    assert judged.judged and judged.growth == 0 and not judged.over
    leaking = [UsageSample(float(t), 100 * MIB, 30 + 17, 10, 3) for t in range(300, 1201, 10)]
    leak = series_growth(ProcessSeries("gateway", "gateway", 42, samples=early + leaking), 60.0, 1200.0, GrowthBounds())
    assert leak["fds"].growth == 17 and leak["fds"].over


def test_inbound_connections_count_the_clients_of_a_listening_port_only() -> None:
    """Real sockets in this process: the accepted side of each connection is inbound, the connecting
    side (an ephemeral port) and a connection to a port it does not listen on are not."""
    before = inbound_connections(psutil.Process().net_connections(kind="tcp"))  # other tests' servers
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        outside = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        port = server.getsockname()[1]
        for _ in range(3):
            stack.enter_context(socket.create_connection(("127.0.0.1", port)))
            stack.enter_context(server.accept()[0])
        # A connection this process makes to a listener it then closes: outgoing, never inbound.
        stack.enter_context(socket.create_connection(outside.getsockname()))
        accepted_elsewhere = outside.accept()[0]
        outside.close()
        stack.enter_context(accepted_elsewhere)
        assert inbound_connections(psutil.Process().net_connections(kind="tcp")) - before == 3
