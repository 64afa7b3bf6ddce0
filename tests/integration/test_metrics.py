"""Both `/metrics` endpoints over real processes (issue 11, first "Done when"): a daemon with
`--metrics-listen 127.0.0.1:0` (it logs the bound port) behind a real gateway, scraped before and
after real streamed requests (tiny model, time scale 0): the request, token, TTFT, per-phase, lane
and busy-ratio metrics move by exactly the right amounts and agree with the daemon's Status. A
running request shows in the lane gauges (`metrics-listen` from the config file there). A bad
address is refused at start with one clear line.

The engine's events reach the metrics on their own thread, after the client saw its Final, so the
"after" scrape is polled until the daemon has counted every request (a deadline, never a pace).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from calculet.client import DaemonClient
from tests.integration.conftest import DaemonProcess
from tests.integration.gateway_process import GatewayProcess
from tests.unit.telemetry.scrape import Scrape, delta

from .helpers import one_clear_line

pytestmark = pytest.mark.integration

WAIT_S = 30.0
PROMPTS = ([5, 6, 7], [11, 12, 13, 14, 15], list(range(40, 52)))
MAX_TOKENS = 7


def metrics_url(daemon: DaemonProcess) -> str:
    """The URL the daemon logged for its metrics listener (port 0 was asked for)."""
    deadline = time.monotonic() + WAIT_S
    while (found := re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", daemon.log())) is None:
        assert time.monotonic() < deadline, f"no metrics line in the daemon log:\n{daemon.log()}"
        time.sleep(0.05)
    return found.group(1)


def scrape_daemon(url: str) -> Scrape:
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200, response.text
    return Scrape(response.text)


def scrape_gateway(gateway: GatewayProcess) -> Scrape:
    with gateway.http(10) as client:
        response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return Scrape(response.text)


def counted(url: str, before: Scrape, requests: int) -> Scrape:
    """The first scrape in which the daemon has counted `requests` more finished requests."""
    deadline = time.monotonic() + WAIT_S
    while delta(after := scrape_daemon(url), before, "calculet_requests_total") < requests:
        assert time.monotonic() < deadline, "the daemon's metrics never counted the requests"
        time.sleep(0.05)
    return after


def test_requests_move_both_endpoints_metrics_by_the_right_amounts(
    start_daemon: Callable[..., DaemonProcess], start_gateway: Callable[..., GatewayProcess]
) -> None:
    daemon = start_daemon("--model", "tiny=tiny", "--metrics-listen", "127.0.0.1:0")
    gateway = start_gateway("--daemon", daemon.target)
    url = metrics_url(daemon)
    with DaemonClient(daemon.target) as client:
        d0, g0, s0 = scrape_daemon(url), scrape_gateway(gateway), client.status()
        with gateway.openai() as oai:
            for i, prompt in enumerate(PROMPTS):
                stream = oai.completions.create(
                    model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, seed=i, stream=True,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
                assert sum(1 for _ in stream) >= 1
        d1 = counted(url, d0, len(PROMPTS))
        g1, s1 = scrape_gateway(gateway), client.status()

    n, tokens, prompt_tokens = len(PROMPTS), len(PROMPTS) * MAX_TOKENS, sum(map(len, PROMPTS))
    # The daemon: requests, tokens, latencies.
    assert delta(d1, d0, "calculet_requests_total", model="tiny", finish="length") == n
    assert delta(d1, d0, "calculet_prompt_tokens_total", model="tiny") == prompt_tokens
    assert delta(d1, d0, "calculet_generation_tokens_total", model="tiny") == tokens
    assert delta(d1, d0, "calculet_time_to_first_token_seconds_count", model="tiny") == n
    assert delta(d1, d0, "calculet_e2e_request_latency_seconds_count", model="tiny") == n
    assert delta(d1, d0, "calculet_inter_token_latency_seconds_count", model="tiny") == tokens - n
    # Per-phase device times: one observation per phase of every device job the device finished.
    jobs = s1.device_counters.finished - s0.device_counters.finished
    assert jobs >= n + MAX_TOKENS - 1
    for phase in ("h2d", "compute", "d2h"):
        assert delta(d1, d0, "calculet_job_phase_seconds_count", phase=phase) == jobs, phase
    assert delta(d1, d0, "calculet_job_phase_seconds_count", phase="compute", task="prefill") == n
    # Busy ratio: the gauges carry Status's figures (the board is idle: they no longer move).
    u = s1.utilization
    assert 0 < u.busy_ratio <= 1
    assert d1.one("calculet_device_busy_ratio") == pytest.approx(u.busy_ratio)
    assert d1.one("calculet_device_busy_seconds_total") == pytest.approx(u.busy_seconds)
    assert sum(d1.one("calculet_engine_busy_seconds_total", bank=b) for b in ("ping", "pong")) == pytest.approx(
        u.busy_seconds
    )
    assert u.generated_tokens - s0.utilization.generated_tokens == tokens
    assert delta(d1, d0, "calculet_job_phase_seconds_sum", phase="compute") == pytest.approx(
        u.compute_seconds - s0.utilization.compute_seconds
    )
    # Lanes: all free again, of the model's lane count.
    lanes = len(s1.models[0].lanes)
    assert d1.one("calculet_kv_lanes_total", model="tiny", generation="1") == lanes > 0
    assert d1.one("calculet_kv_lanes_used", model="tiny", generation="1") == 0
    # Per-model memory: per chip, the planner's figure beside what the configure took (calsim reserves
    # exactly the plan for the tiny package), in Status and in the metric; no D2D declared, none moved.
    memory = s1.models[0].memory
    assert [c.chip for c in memory] == [0, 1] and all(c.measured for c in memory)
    for c in memory:
        assert c.dram_bytes == c.planned_dram_bytes > 0 and c.sram_bytes == c.planned_sram_bytes
        for kind, source, value in (("dram", "planned", c.planned_dram_bytes), ("dram", "measured", c.dram_bytes)):
            labels = {"model": "tiny", "generation": "1", "chip": str(c.chip), "memory": kind, "source": source}
            assert d1.one("calculet_model_memory_bytes", **labels) == value
    assert (u.d2d_bytes, u.d2d_seconds) == (0, 0.0) and d1.one("calculet_device_d2d_bytes_total") == 0
    # The gateway: its own requests, TTFT, tokens and boards.
    assert delta(g1, g0, "calculet_gateway_requests_total", route="/v1/completions", status="200") == n
    assert delta(g1, g0, "calculet_gateway_time_to_first_token_seconds_count", model="tiny") == n
    assert delta(g1, g0, "calculet_gateway_e2e_request_latency_seconds_count", route="/v1/completions") == n
    assert delta(g1, g0, "calculet_gateway_generation_tokens_total", model="tiny") == tokens
    assert delta(g1, g0, "calculet_gateway_prompt_tokens_total", model="tiny") == prompt_tokens
    assert g1.one("calculet_gateway_board_up", board=daemon.target) == 1


def test_a_running_request_shows_in_the_lane_metrics(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text('[daemon]\nmetrics-listen = "127.0.0.1:0"\n')
    # Time scale 1: the modelled board takes its time, so the long request is still running when seen.
    daemon = start_daemon("--config", str(config), "--model", "tiny=tiny", "--time-scale", "1")
    url = metrics_url(daemon)

    def lanes_used() -> float:
        return scrape_daemon(url).one("calculet_kv_lanes_used", model="tiny", generation="1")

    with DaemonClient(daemon.target) as client:
        job = client.submit("tiny", [1, 2, 3], max_tokens=250, ignore_eos=True)
        deadline = time.monotonic() + WAIT_S
        while lanes_used() != 1:
            assert time.monotonic() < deadline, "the running request never showed in calculet_kv_lanes_used"
            time.sleep(0.05)
        s = scrape_daemon(url)
        assert s.one("calculet_requests_running", model="tiny") == 1
        total = s.one("calculet_kv_lanes_total", model="tiny", generation="1")
        assert s.one("calculet_kv_lane_usage_ratio", model="tiny", generation="1") == pytest.approx(1 / total)
        client.cancel(job.job_id)
        while lanes_used() != 0:
            assert time.monotonic() < deadline, "the cancelled request's lane never showed free"
            time.sleep(0.05)


@pytest.mark.parametrize("listen", ["nonsense", "127.0.0.1:99999", "127.0.0.1:"])
def test_a_bad_metrics_address_exits_2_with_one_line(tmp_path: Path, models_root: Path, listen: str) -> None:
    cmd = [
        sys.executable, "-m", "calculet.daemon.main", "--listen", f"unix:{tmp_path / 'd.sock'}",
        "--models-root", str(models_root), "--time-scale", "0", "--metrics-listen", listen,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    one_clear_line(proc, "metrics_listen", listen)
    assert proc.returncode == 2
