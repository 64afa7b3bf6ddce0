"""The validity part of a `--workload structured|tools` report: how many measured answers were what
they were asked to be (`workload.check`), their finish reasons, and the first problems; as JSON
(`validity_json`, the report's `validity`) and as a table built from it (`validity_table`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from rich.table import Table

from calculet.ops.bench.structured.backend import Verdict

SHOWN_PROBLEMS = 5


def validity_json(verdicts: Mapping[int, Verdict], measured: Iterable[int]) -> dict[str, Any]:
    """The measured requests' verdicts (warm-up ones left out; a failed request has no verdict and
    counts as checked 0 times: see the report's failed count).

    Returns:
        `{"checked", "valid", "valid_share", "finish_reasons", "problems": [{"index", "problem"}]}`.
    """
    mine = [(i, verdicts[i]) for i in measured if i in verdicts]
    valid = sum(v.problem is None for _, v in mine)
    finishes = Counter(str(v.finish_reason) for _, v in mine)
    problems = [{"index": i, "problem": v.problem} for i, v in mine if v.problem is not None]
    return {
        "checked": len(mine),
        "valid": valid,
        "valid_share": valid / len(mine) if mine else None,
        "finish_reasons": dict(sorted(finishes.items())),
        "problems": problems[:SHOWN_PROBLEMS],
    }


def validity_table(report: Mapping[str, Any]) -> Table:
    validity = report["validity"]
    table = Table(title="answers checked", show_header=False, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    share = validity["valid_share"]
    shown = "n/a" if share is None else f"{share * 100:.1f} %"
    table.add_row("valid / checked", f"{validity['valid']} / {validity['checked']} ({shown})")
    table.add_row("finish reasons", ", ".join(f"{k} {v}" for k, v in validity["finish_reasons"].items()) or "n/a")
    for problem in validity["problems"]:
        table.add_row(f"request {problem['index']}", problem["problem"])
    return table
