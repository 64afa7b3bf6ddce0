"""Run a command and record the CPU seconds a process and its descendants spent meanwhile.

Not a test. `bench/perf_tables.sh` wraps a `calctl bench` run in it to read the gateway's CPU (the
supervisor and every worker of `calculet-gateway --workers N`) over exactly that run:

    .venv/bin/python bench/process_cpu.py --pid PID --out OUT.json -- COMMAND [ARGS...]

OUT.json: {"pid", "processes", "cpu_s", "wall_s", "returncode"}; a descendant that exits during the
run counts up to its last reading (none here: workers live through the run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import psutil


def tree_cpu(root: psutil.Process) -> dict[int, float]:
    out: dict[int, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        out[proc.pid] = times.user + times.system
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    root = psutil.Process(args.pid)
    before = tree_cpu(root)
    t0 = time.perf_counter()
    rc = subprocess.call(command)
    wall = time.perf_counter() - t0
    after = tree_cpu(root)
    cpu = sum(after[pid] - before.get(pid, 0.0) for pid in after)
    report = {"pid": args.pid, "processes": len(after), "cpu_s": cpu, "wall_s": wall, "returncode": rc}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
