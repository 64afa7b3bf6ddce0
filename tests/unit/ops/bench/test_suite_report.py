"""The suite's markdown report and plots, from a hand-made suite document: two runs with figures at
concurrency 1 and 4, one that failed before it ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from calculet.ops.bench.suite.document import SuiteDocument
from calculet.ops.bench.suite.plot import limit_series, plottable, series, write_plots
from calculet.ops.bench.suite.report import render_markdown, wall_limit

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WORKLOAD = {"name": "short", "short_prompt": [16, 64], "long_prompt": 0, "long_fraction": 0.0, "output": 32}


def stats(p50: float, p95: float, p99: float) -> dict[str, float]:
    return {"count": 8, "mean": p50, "p50": p50, "p90": p95 - 1.0, "p95": p95, "p99": p99}


def measured(concurrency: int, tokens_per_s: float, limit: float) -> dict[str, Any]:
    """A run record as the runner writes it, figures chosen by hand."""
    return {
        "name": f"if2-b4.short.c{concurrency}.gateway",
        "config": "if2-b4",
        "boards": 1,
        "workload": WORKLOAD,
        "concurrency": concurrency,
        "target": "gateway",
        "requests": 8,
        "warmup": 1,
        "time_scale": 0.5,
        "estimate": {"modelled_s": 2.0, "wall_s": 1.0},
        "command": f"calctl bench --gateway http://127.0.0.1:1 --model m --concurrency {concurrency}",
        "error": None,
        "host_cpu": {"us_per_token_serving": 812.4, "host_busy": 0.93, "host_limited": True},
        "report": {
            "counts": {"completed": 8, "failed": 0},
            "throughput": {"output_tokens_per_s": tokens_per_s},
            "goodput": {"output_tokens_per_s": tokens_per_s * 0.8},  # run with --slo: 80 % met it
            "latency_ms": {
                "ttft": stats(12.0, 15.0, 20.0),
                "tpot": stats(40.25, 41.0, 44.0),
                "itl": stats(40.0, 42.0, 50.0),
                "e2e": None,
            },
            "device": {"busy_ratio": 0.875},
            "timing_model": {
                "limit": {"output_tokens_per_s": limit},
                "relative": {
                    "ttft": stats(1.25, 1.5, 2.0),
                    "tpot": stats(1.03, 1.1, 1.2),
                    "itl": stats(1.0, 1.1, 1.3),
                    "e2e": stats(1.1, 1.2, 1.3),
                    "throughput": 0.95,
                    "busy_of_wall": 0.9,
                },
                "tpot_excess_ms": stats(0.75, 1.0, 2.0),
            },
        },
    }


CONFIG = {
    "name": "if2-b4",
    "policy": "continuous",
    "max_inflight": 2,
    "decode_batch": 4,
    "boards": 1,
    "package": "tiny-b4",
    "time_scale": 0.5,
    "daemon_flags": ["--max-inflight", "2"],
    "error": None,
}


def document() -> dict[str, Any]:
    broken = measured(8, 0.0, 0.0) | {
        "name": "if2-b4.short.c8.gateway", "command": None, "error": "the fleet failed: boom", "report": None,
        "host_cpu": None, "workload": WORKLOAD,
    }  # fmt: skip
    return {
        "schema": "calculet.bench-suite/1",
        "command": "calctl bench suite --preset tiny --quick",
        "preset": "tiny",
        "mode": "quick",
        "seed": 0,
        "host": {"cpus": 2, "host_cpu_us_per_token": 1000},
        "time_scale_rule": "--time-scale 0.5 for every fleet.",
        "configs": [CONFIG],
        "runs": [measured(1, 30.0, 20.0), measured(4, 90.0, 50.0), broken],
    }


def test_the_markdown_report() -> None:
    text = render_markdown(document())
    assert text.startswith("# calctl bench suite: tiny, quick matrix\n")
    assert "Made by `calctl bench suite --preset tiny --quick` on 2 CPU(s); 3 runs." in text
    assert "| if2-b4 | continuous | 2 | 4 | 1 | tiny-b4 | 0.5 | `--max-inflight 2` | ok |" in text
    assert "### workload `short`: prompts 16..64 tokens, 32 output tokens" in text
    # latency: p50 / p95 / p99 in ms, n/a without figures
    assert (
        "| if2-b4 | gateway | 1 | 0.5 | 8 / 0 | 12.0 / 15.0 / 20.0 | 40.2 / 41.0 / 44.0 | 40.0 / 42.0 / 50.0 | n/a |"
        in text
    )
    # throughput: the limit per wall second is the modelled limit over the time scale (20 / 0.5)
    row = (
        "| if2-b4 | gateway | 4 | 0.5 | 90.0 | 72.0 | 100.0 | 0.950 | 87.5 % | 90.0 % "
        "| 1.25 | 1.03 | 1.00 | 1.10 | 0.75 | 812 | 93.0 % (limit!) |"
    )
    assert row in text
    assert "| if2-b4 | gateway | 8 | 0.5 | n/a | n/a | n/a | n/a | n/a |" in text
    assert "calctl bench --gateway http://127.0.0.1:1 --model m --concurrency 4" in text
    assert "# if2-b4.short.c8.gateway: not run (the fleet failed: boom)" in text
    assert "- `if2-b4.short.c8.gateway`: the fleet failed: boom" in text


def test_the_plot_series() -> None:
    runs = document()["runs"]
    assert wall_limit(runs[0]) == 40.0 and wall_limit(runs[2]) is None  # not run
    assert series(runs, ("throughput", "output_tokens_per_s")) == {"if2-b4 gateway": [(1, 30.0), (4, 90.0)]}
    assert series(runs, ("latency_ms", "e2e", "p50")) == {}
    assert limit_series(runs[:2]) == {"if2-b4 gateway": [(1, 40.0), (4, 100.0)]}
    assert plottable(runs) and not plottable(runs[:1])


def test_the_document_files(tmp_path: Path) -> None:
    doc = document()
    suite = SuiteDocument(tmp_path, {k: v for k, v in doc.items() if k not in ("schema", "configs", "runs")})
    for config in doc["configs"]:
        suite.add_config(config)
    for run in doc["runs"]:
        suite.add_run(run)
    assert suite.failed == ["if2-b4.short.c8.gateway"]
    written = suite.write_report(plots=True)
    assert [p.name for p in written] == ["report.md", "short.png"]
    assert (tmp_path / "plots" / "short.png").read_bytes()[:8] == PNG_MAGIC
    assert "![short](plots/short.png)" in (tmp_path / "report.md").read_text()
    assert '"schema": "calculet.bench-suite/1"' in suite.json_path.read_text()


def test_no_plot_for_a_single_concurrency(tmp_path: Path) -> None:
    assert write_plots(tmp_path, document()["runs"][:1]) == []
