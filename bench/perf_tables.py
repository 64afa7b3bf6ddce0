"""Print docs/performance.md's issue 22 tables from a `bench/perf_tables.sh OUT_DIR` run.

Not a test. Reads the `calctl bench --json` reports (and the gateway CPU readings) in OUT_DIR and
prints markdown tables; the host_cpu and step_gap parts are text files printed as they are.

    .venv/bin/python bench/perf_tables.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SAMPLINGS = {"greedy": "greedy", "topk40": "T 0.8, top-k 40", "topp": "T 0.8, top-p 0.9", "t1": "T 1 (no truncation)"}


def load(out: Path, name: str) -> dict[str, Any] | None:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def first_board(report: dict[str, Any]) -> dict[str, Any]:
    boards = report["device"]["boards"]
    return boards[0] if boards else {}


def row_of(report: dict[str, Any]) -> dict[str, Any]:
    tm = report.get("timing_model") or {}
    rel = tm.get("relative") or {}
    copies = first_board(report).get("copies") or {}
    lat = report["latency_ms"]
    return {
        "tok_s": report["throughput"]["output_tokens_per_s"],
        "limit": (tm.get("limit") or {}).get("output_tokens_per_s"),
        "ratio": rel.get("throughput"),
        "busy": rel.get("busy_of_wall"),
        "batch": (tm.get("load") or {}).get("decode_batch"),
        "step": (tm.get("floors_ms") or {}).get("decode_step"),
        "tpot": lat["tpot"].get("p50"),
        "ttft": lat["ttft"].get("p50"),
        "d2h": copies.get("d2h_bytes_per_row"),
        "full": copies.get("full_row_read_share"),
        "sampling": copies.get("sampling_us_per_row"),
        "failed": report["counts"]["failed"],
        "requests": report["counts"]["requests"],
    }


def modes(out: Path) -> None:
    print("| sampling | logits | D2H per row | rows read in full | sampling us/row | tok/s | limit tok/s | "
          "tok/s / limit | busy of wall | TPOT p50 ms | ok / failed |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, label in SAMPLINGS.items():
        for mode in ("full", "topk"):
            report = load(out, f"modes-{mode}-{key}")
            if report is None:
                continue
            r = row_of(report)
            d2h = None if r["d2h"] is None else r["d2h"] / 1024
            full = None if r["full"] is None else 100 * r["full"]
            print(f"| {label} | {mode} | {num(d2h)} KB | {num(full, '{:.0f}')} % | {num(r['sampling'], '{:.0f}')} | "
                  f"{num(r['tok_s'])} | {num(r['limit'])} | {num(r['ratio'], '{:.3f}')} | "
                  f"{num(None if r['busy'] is None else 100 * r['busy'])} % | {num(r['tpot'], '{:.2f}')} | "
                  f"{r['requests'] - r['failed']} / {r['failed']} |")  # fmt: skip


def batches(out: Path) -> None:
    print("| logits | clients | decode batch | tok/s | limit tok/s | tok/s / limit | busy of wall | TPOT p50 ms | "
          "modelled step ms | TPOT - step ms | sampling us/row | ok / failed |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode in ("full", "topk"):
        for c in (1, 4, 8, 16):
            report = load(out, f"batches-{mode}-c{c}")
            if report is None:
                continue
            r = row_of(report)
            excess = None if r["tpot"] is None or r["step"] is None else r["tpot"] - r["step"]
            print(f"| {mode} | {c} | {r['batch']} | {num(r['tok_s'])} | {num(r['limit'])} | "
                  f"{num(r['ratio'], '{:.3f}')} | {num(None if r['busy'] is None else 100 * r['busy'])} % | "
                  f"{num(r['tpot'], '{:.2f}')} | {num(r['step'], '{:.2f}')} | {num(excess, '{:.2f}')} | "
                  f"{num(r['sampling'], '{:.0f}')} | {r['requests'] - r['failed']} / {r['failed']} |")  # fmt: skip


def workers(out: Path) -> None:
    print("| workers | tok/s | limit tok/s | tok/s / limit | gateway CPU us/token | gateway CPU % of a core | "
          "tokens per board | TTFT p50 / p90 ms | ok / failed |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for w in (1, 2, 4):
        report = load(out, f"workers-{w}")
        cpu = load(out, f"workers-{w}.cpu")
        if report is None or cpu is None:
            continue
        r = row_of(report)
        counts = report["counts"]
        warmup = report["config"].get("warmup", 0) or 0
        tokens = counts["output_tokens"] * (counts["requests"] + warmup) / max(1, counts["requests"])
        per_board = ", ".join(str(b.get("generated_tokens")) for b in report["device"]["boards"])
        lat = report["latency_ms"]["ttft"]
        print(f"| {w} | {num(r['tok_s'])} | {num(r['limit'])} | {num(r['ratio'], '{:.3f}')} | "
              f"{num(cpu['cpu_s'] * 1e6 / tokens, '{:.0f}')} | {num(100 * cpu['cpu_s'] / cpu['wall_s'])} | "
              f"{per_board} | {num(lat.get('p50'), '{:.0f}')} / {num(lat.get('p90'), '{:.0f}')} | "
              f"{r['requests'] - r['failed']} / {r['failed']} |")  # fmt: skip


def main() -> None:
    out = Path(sys.argv[1])
    for title, table in (("modes", modes), ("batches", batches), ("workers", workers)):
        print(f"\n### {title}\n")
        table(out)
    for name in ("host_cpu.txt", "host_cpu_ttft.txt", "step_gap_greedy.txt", "step_gap_t1.txt"):
        path = out / name
        if path.exists():
            print(f"\n### {name}\n\n```\n{path.read_text().strip()}\n```")


if __name__ == "__main__":
    main()
