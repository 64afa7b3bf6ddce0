"""The suite document (`calculet.bench-suite/1`) and its files: `suite.json`, `report.md`, plots.

`SuiteDocument` owns the document while the suite runs: every run record is appended and the JSON
rewritten at once (so an interrupted suite leaves what it measured), the configurations are added
as their fleets finish, and `write_report` renders the markdown (report.py; for the multi-turn
comparison, mode `multiturn`, multiturn_report.py) and, when matplotlib is there, the plots (plot.py,
multiturn_plot.py) into `<dir>/plots/`. Keys: `schema`, `command`, `preset`, `mode`, `seed`, `host`
(`cpus`, `host_cpu_us_per_token`), `time_scale_rule`, `configs[]`, `runs[]`, and for the multi-turn
comparison `multiturn` (its sizes) and `targets[]` (docs/benchmarking.md, "bench suite").
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calculet.ops.bench.suite.multiturn_plot import write_multiturn_plot
from calculet.ops.bench.suite.multiturn_report import render_multiturn_markdown
from calculet.ops.bench.suite.multiturn_targets import suite_targets
from calculet.ops.bench.suite.plot import write_plots
from calculet.ops.bench.suite.report import render_markdown

SCHEMA = "calculet.bench-suite/1"
MULTITURN = "multiturn"


class SuiteDocument:
    """The suite's results, written to `out_dir` as they come. Not thread-safe.

    Args:
        out_dir: where `suite.json`, `report.md` and `plots/` go.
        header: the document's keys other than `configs` and `runs`.
    """

    def __init__(self, out_dir: Path, header: dict[str, Any]) -> None:
        self.out_dir = out_dir
        self.doc: dict[str, Any] = {"schema": SCHEMA, **header, "configs": [], "runs": []}

    @property
    def json_path(self) -> Path:
        return self.out_dir / "suite.json"

    def _save(self) -> None:
        """Raises: OSError: the file cannot be written."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.doc, indent=1) + "\n", encoding="utf-8")
        tmp.replace(self.json_path)

    def add_run(self, record: dict[str, Any]) -> None:
        self.doc["runs"].append(record)
        self._save()

    def add_config(self, config: dict[str, Any]) -> None:
        self.doc["configs"].append(config)
        self._save()

    @property
    def failed(self) -> list[str]:
        """Names of the runs and configurations that ended with an error."""
        return [r["name"] for r in self.doc["configs"] + self.doc["runs"] if r.get("error")]

    def recorder(
        self, say: Callable[[str], None], progress: Callable[[dict[str, Any]], str]
    ) -> Callable[[dict[str, Any]], None]:
        """The `on_record` of a suite's runs: add the run and say its progress line."""

        def on_record(record: dict[str, Any]) -> None:
            self.add_run(record)
            say(progress(record))

        return on_record

    def finish(self, say: Callable[[str], None], plots: bool) -> None:
        """Write the report (and plots) and say every file written.

        Raises:
            OSError: a file cannot be written.
        """
        for path in self.write_report(plots=plots):
            say(f"wrote {path}")
        say(f"wrote {self.json_path}")

    def write_report(self, plots: bool) -> list[Path]:
        """Write `report.md` and, when `plots` and matplotlib is installed, the plots.

        Returns:
            Every file written.

        Raises:
            OSError: a file cannot be written.
        """
        report = self.out_dir / "report.md"
        written = [report]
        drawn: list[Path] = []
        multiturn = self.doc.get("mode") == MULTITURN
        if plots and importlib.util.find_spec("matplotlib") is not None:
            draw = write_multiturn_plot if multiturn else write_plots
            drawn = draw(self.out_dir / "plots", self.doc["runs"])
        if multiturn:
            self.doc["targets"] = suite_targets(self.doc["runs"])
        text = render_multiturn_markdown(self.doc) if multiturn else render_markdown(self.doc)
        if drawn:
            text += "\n## Plots\n\n" + "".join(f"![{p.stem}](plots/{p.name})\n" for p in drawn)
        report.write_text(text, encoding="utf-8")
        self._save()
        return written + drawn
