"""`merge_expositions`: workers' Prometheus texts merged into one, from literal texts: one HELP and
TYPE per family, every sample labelled with its worker (histograms' _bucket/_sum/_count included),
label values escaped as the format requires, and a worker that did not answer (or answered garbage)
shows only as `calculet_gateway_worker_up{worker="I"} 0`."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from calculet.gateway.telemetry.metrics import GatewayMetrics
from calculet.gateway.telemetry.metrics_merge import merge_expositions

COUNTER_0 = """\
# HELP calculet_gateway_requests_total HTTP requests answered
# TYPE calculet_gateway_requests_total counter
calculet_gateway_requests_total{route="/health",status="200"} 3.0
calculet_gateway_requests_total{route="/v1/completions",status="200"} 2.0
"""
COUNTER_1 = """\
# HELP calculet_gateway_requests_total HTTP requests answered
# TYPE calculet_gateway_requests_total counter
calculet_gateway_requests_total{route="/v1/completions",status="200"} 5.0
# HELP calculet_gateway_boards Boards per connection state
# TYPE calculet_gateway_boards gauge
calculet_gateway_boards{state="up"} 2.0
"""


def _lines(merged: bytes) -> list[str]:
    return merged.decode().splitlines()


def test_families_are_merged_with_one_help_and_type_and_a_worker_label() -> None:
    assert _lines(merge_expositions([("0", COUNTER_0), ("1", COUNTER_1)])) == [
        "# HELP calculet_gateway_requests_total HTTP requests answered",
        "# TYPE calculet_gateway_requests_total counter",
        'calculet_gateway_requests_total{route="/health",status="200",worker="0"} 3.0',
        'calculet_gateway_requests_total{route="/v1/completions",status="200",worker="0"} 2.0',
        'calculet_gateway_requests_total{route="/v1/completions",status="200",worker="1"} 5.0',
        "# HELP calculet_gateway_boards Boards per connection state",
        "# TYPE calculet_gateway_boards gauge",
        'calculet_gateway_boards{state="up",worker="1"} 2.0',
        "# HELP calculet_gateway_worker_up 1 when this scrape holds the worker's metrics, 0 when the worker did "
        "not answer",
        "# TYPE calculet_gateway_worker_up gauge",
        'calculet_gateway_worker_up{worker="0"} 1.0',
        'calculet_gateway_worker_up{worker="1"} 1.0',
    ]


HISTOGRAM = """\
# HELP calculet_gateway_time_to_first_token_seconds Completion requests: arrival to the first visible text
# TYPE calculet_gateway_time_to_first_token_seconds histogram
calculet_gateway_time_to_first_token_seconds_bucket{le="0.1",model="tiny"} {low}
calculet_gateway_time_to_first_token_seconds_bucket{le="+Inf",model="tiny"} {all}
calculet_gateway_time_to_first_token_seconds_count{model="tiny"} {all}
calculet_gateway_time_to_first_token_seconds_sum{model="tiny"} 0.25
"""


def test_histograms_keep_buckets_count_and_sum_per_worker() -> None:
    texts = [(str(i), HISTOGRAM.replace("{low}", str(i)).replace("{all}", str(i + 2))) for i in range(2)]
    lines = _lines(merge_expositions(texts))
    name = "calculet_gateway_time_to_first_token_seconds"
    assert lines[:2] == [
        f"# HELP {name} Completion requests: arrival to the first visible text",
        f"# TYPE {name} histogram",
    ]
    assert lines[2:10] == [
        f'{name}_bucket{{le="0.1",model="tiny",worker="0"}} 0.0',
        f'{name}_bucket{{le="+Inf",model="tiny",worker="0"}} 2.0',
        f'{name}_count{{model="tiny",worker="0"}} 2.0',
        f'{name}_sum{{model="tiny",worker="0"}} 0.25',
        f'{name}_bucket{{le="0.1",model="tiny",worker="1"}} 1.0',
        f'{name}_bucket{{le="+Inf",model="tiny",worker="1"}} 3.0',
        f'{name}_count{{model="tiny",worker="1"}} 3.0',
        f'{name}_sum{{model="tiny",worker="1"}} 0.25',
    ]
    assert sum(line.startswith("# TYPE") for line in lines) == 2  # the histogram and worker_up


def test_label_values_are_escaped_again() -> None:
    text = (
        "# HELP calculet_gateway_retries_total Resubmits before a token\n"
        "# TYPE calculet_gateway_retries_total counter\n"
        'calculet_gateway_retries_total{model="a\\"b\\\\c\\nd"} 1.0\n'
    )
    merged = merge_expositions([("0", text)])
    assert 'calculet_gateway_retries_total{model="a\\"b\\\\c\\nd",worker="0"} 1.0' in _lines(merged)
    (family, _) = text_string_to_metric_families(merged.decode())
    assert family.samples[0].labels == {"model": 'a"b\\c\nd', "worker": "0"}


def test_a_worker_that_did_not_answer_or_answered_garbage_is_down() -> None:
    lines = _lines(merge_expositions([("0", COUNTER_0), ("1", None), ("2", "not {metrics")]))
    assert [line for line in lines if "worker_up{" in line] == [
        'calculet_gateway_worker_up{worker="0"} 1.0',
        'calculet_gateway_worker_up{worker="1"} 0.0',
        'calculet_gateway_worker_up{worker="2"} 0.0',
    ]
    assert not any('worker="1"' in line or 'worker="2"' in line for line in lines if "worker_up" not in line)


def test_a_family_of_another_type_is_left_out_for_that_worker() -> None:
    other = COUNTER_1.replace("calculet_gateway_boards", "calculet_gateway_boards_total").replace("gauge", "counter")
    gauge = "# HELP calculet_gateway_boards Boards\n# TYPE calculet_gateway_boards gauge\ncalculet_gateway_boards 1\n"
    lines = _lines(merge_expositions([("0", gauge), ("1", other)]))
    assert "# TYPE calculet_gateway_boards gauge" in lines and 'calculet_gateway_boards{worker="0"} 1.0' in lines
    assert not any(line.startswith("calculet_gateway_boards_total") for line in lines)
    assert 'calculet_gateway_requests_total{route="/v1/completions",status="200",worker="1"} 5.0' in lines


def test_a_gateways_own_metrics_round_trip_with_only_the_label_added() -> None:
    """The real exposition of a worker: merged alone, it is the same text with `worker="0"` on every
    sample (and worker_up at the end)."""
    metrics = GatewayMetrics()
    try:
        metrics.http_request("/v1/completions", 200, 0.2)
        metrics.resubmitted("tiny", mid_stream=True)
        own = metrics.render()[0].decode()
    finally:
        metrics.close()
    merged = merge_expositions([("0", own)]).decode()
    expected = [
        line if line.startswith("#") else line.replace("} ", ',worker="0"} ') if "{" in line else
        line.replace(" ", '{worker="0"} ', 1)
        for line in own.splitlines()
    ]  # fmt: skip
    assert merged.splitlines()[: len(expected)] == expected
