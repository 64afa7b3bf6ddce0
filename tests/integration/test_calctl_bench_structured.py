"""`calctl bench --workload structured|tools` as a real process through the real gateway in front of
a calsim daemon (the qwen package, time scale 0): every measured answer is checked and valid (schema'd content
that validates; exactly one call of an offered function, the named one when named, whose arguments
validate), the report carries the `validity` section and the table shows it. No wall-clock figure
is asserted. The flags and the checks are unit-tested (tests/unit/ops/bench/test_structured_bench.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.gateway_process import GatewayProcess
from tests.integration.local_fleet import local_fleet
from tests.integration.test_calctl_bench import run_bench

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def qwen_gateway(tmp_path_factory: pytest.TempPathFactory, models_root: Path) -> Iterator[GatewayProcess]:
    """One qwen board (Qwen3's tokenizer and template; tiny's context is 256) behind a gateway, for
    both workloads: each run's requests end before it returns, so the second finds the board idle."""
    with local_fleet(tmp_path_factory.mktemp("structured"), models_root, [["--model", "qwen=qwen"]]) as (_, gw):
        yield gw


@pytest.mark.parametrize(("workload", "finish"), [("structured", "stop"), ("tools", "tool_calls")])
def test_every_checked_answer_is_valid(
    qwen_gateway: GatewayProcess, tmp_path: Path, workload: str, finish: str
) -> None:
    proc, report = run_bench(
        tmp_path, "--gateway", f"unix:{qwen_gateway.socket}", "--model", "qwen", "--workload", workload,
        "--requests", "12", "--concurrency", "4", "--warmup", "2", "--output-len", "256",
    )  # fmt: skip
    counts = report["counts"]
    assert (counts["completed"], counts["failed"]) == (12, 0), report["errors"]
    validity = report["validity"]
    assert (validity["checked"], validity["valid"], validity["problems"]) == (12, 12, []), validity
    assert validity["finish_reasons"] == {finish: 12}
    assert report["config"]["workload"]["source"] == workload
    assert "valid / checked" in proc.stdout and "12 / 12" in proc.stdout
