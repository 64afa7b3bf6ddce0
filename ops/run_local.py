"""`make run`: the main job on the embedded default, in the foreground.

Builds the two calsim packages (once), validates them, prints their capacity plans, then serves
the `tiny` model from one calsim board daemon on a Unix socket until Ctrl-C. The first lines say
how to reach it. (The gateway and a multi-board fleet extend this when they exist.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from calculet.daemon import main as daemon_main
from calculet.ops import calctl

PRESETS = ("tiny", "qwen3-30b-a3b")


def banner(socket: str, model: str) -> str:
    snippet = (
        "from calculet.client import DaemonClient\n"
        f"with DaemonClient({socket!r}) as c:\n"
        f"    g = c.generate({model!r}, [1, 2, 3], max_tokens=16, temperature=0)\n"
        "    print(list(g), g.final.reason)"
    )
    return "\n".join(
        [
            f"Calculet: calsim board 0 will serve model {model!r} on {socket}",
            f"  status:  .venv/bin/calctl status --daemon {socket}   (or export CALCULET_DAEMON={socket})",
            "  health:  .venv/bin/calctl health      load/unload/drain/resume: .venv/bin/calctl --help",
            "  Python:  .venv/bin/python - <<'PY'",
            *("           " + line for line in snippet.splitlines()),
            "           PY",
            "  Stop with Ctrl-C (drains running requests first).",
            "",
        ]
    )


def prepare_packages(models: Path) -> None:
    for preset in PRESETS:
        out = models / preset
        if not (out / "calculet-package.json").exists():
            print(f"== building calsim package {preset} -> {out}", flush=True)
            if calctl.main(["package", "build-sim", "--preset", preset, "--force", str(out)]) != 0:
                raise SystemExit(f"building {preset} failed")
        print(f"== validating {out}", flush=True)
        if calctl.main(["package", "validate", str(out)]) != 0:
            raise SystemExit(f"package {out} is invalid")
        print(f"== capacity plan for {preset}", flush=True)
        calctl.main(["capacity", "--package", str(out)])
    print("== Qwen3-30B-A3B at full context 40,960: how many lanes fit beside the weights", flush=True)
    calctl.main(["capacity", "--preset", "qwen3-30b-a3b", "--lanes", "1", "2", "4", "--context", "40960"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_local", description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("run"), help="working directory (packages, socket)")
    parser.add_argument("--time-scale", default="1.0", help="calsim time scale (1 = the board's real speed)")
    parser.add_argument("--policy", default="continuous", choices=("continuous", "serial"))
    args = parser.parse_args(argv)
    models = args.dir / "models"
    socket = f"unix:{args.dir / 'board0.sock'}"
    print(banner(socket, "tiny"), flush=True)
    prepare_packages(models)
    print(f"== starting calculet-daemon (policy {args.policy}, time scale {args.time_scale})", flush=True)
    flags = {
        "--board": "0",
        "--listen": socket,
        "--models-root": str(models),
        "--model": "tiny=tiny",
        "--time-scale": args.time_scale,
        "--policy": args.policy,
    }
    return daemon_main.main([item for pair in flags.items() for item in pair])


if __name__ == "__main__":
    sys.exit(main())
