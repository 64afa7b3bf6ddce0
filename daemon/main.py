"""`calculet-daemon`: one process per board. Flags override the TOML config file.

    calculet-daemon --board 0 --device calsim --listen unix:run/board0.sock \
        --models-root models --model tiny=tiny --time-scale 0 --policy continuous --max-inflight 2
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calculet.daemon.core.device_core import POLICIES, DaemonConfig, DeviceCore
from calculet.daemon.core.models import LoadProgress
from calculet.daemon.errors import CalculetError, InvalidArgument
from calculet.daemon.server.app import DEFAULT_MAX_MESSAGE_BYTES, serve

log = logging.getLogger("calculet.daemon")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="calculet-daemon", description="Serve one Calculet board over gRPC.")
    p.add_argument("--config", type=Path, help="TOML file ([daemon] table); flags override it")
    p.add_argument("--board", type=int, help="board index on this host (default 0)")
    p.add_argument("--device", help="device driver name (default calsim)")
    p.add_argument("--listen", help="unix:PATH, PATH.sock or HOST:PORT (default unix:run/board<N>.sock)")
    p.add_argument("--models-root", type=Path, help="package paths must resolve inside this directory")
    p.add_argument("--model", action="append", default=[], metavar="ALIAS=PATH", help="startup model (repeatable)")
    p.add_argument("--time-scale", type=float, help="calsim: wall seconds per modelled second (0 = never sleep)")
    p.add_argument("--fault-plan", type=Path, help="calsim: JSON fault plan")
    p.add_argument("--fault-injection", action="store_true", default=None, help="enable the InjectFault RPC")
    p.add_argument("--policy", choices=POLICIES, help="continuous (default) or serial (today's product)")
    p.add_argument("--max-inflight", type=int, choices=(1, 2), help="jobs in flight (default 2)")
    p.add_argument("--job-timeout", type=float, help="seconds to wait for one device job before a reset")
    p.add_argument("--drain-timeout", type=float, help="seconds unload/drain/shutdown wait for running jobs")
    p.add_argument("--queue-depth", type=int, help="waiting requests before Submit is refused")
    p.add_argument("--admission-timeout", type=float, help="seconds a request may wait for a KV lane")
    p.add_argument(
        "--decode-jobs-per-model",
        type=int,
        choices=(1, 2),
        help="decode jobs of one model in flight: 1 = one batch of every ready sequence (default), "
        "2 = two cohorts alternating between the ping/pong banks",
    )
    p.add_argument("--max-message-bytes", type=int, help=f"gRPC message limit (default {DEFAULT_MAX_MESSAGE_BYTES})")
    p.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING")
    return p


def merged_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Config file values, then flags that were given."""
    settings: dict[str, Any] = {}
    if args.config is not None:
        try:
            settings.update(tomllib.loads(args.config.read_text(encoding="utf-8")).get("daemon", {}))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgument(f"config {args.config}: {exc}") from None
    flags = {
        "board": args.board,
        "device": args.device,
        "listen": args.listen,
        "models_root": args.models_root,
        "time_scale": args.time_scale,
        "fault_plan": args.fault_plan,
        "fault_injection": args.fault_injection,
        "policy": args.policy,
        "max_inflight": args.max_inflight,
        "job_timeout": args.job_timeout,
        "drain_timeout": args.drain_timeout,
        "queue_depth": args.queue_depth,
        "admission_timeout": args.admission_timeout,
        "decode_jobs_per_model": args.decode_jobs_per_model,
        "max_message_bytes": args.max_message_bytes,
        "log_level": args.log_level,
    }
    settings.update({k: v for k, v in flags.items() if v is not None})
    models = dict(settings.get("models", {}))
    for spec in args.model:
        alias, sep, path = spec.partition("=")
        if not sep or not alias or not path:
            raise InvalidArgument(f"--model {spec!r}: expected ALIAS=PATH")
        models[alias] = path
    settings["models"] = models
    return settings


def config_from(settings: dict[str, Any]) -> DaemonConfig:
    options: dict[str, Any] = {}
    if settings.get("device", "calsim") == "calsim":
        options["time_scale"] = float(settings.get("time_scale", 1.0))
        if settings.get("fault_plan") is not None:
            options["fault_plan"] = str(settings["fault_plan"])
    return DaemonConfig(
        board=int(settings.get("board", 0)),
        device=str(settings.get("device", "calsim")),
        device_options=options,
        models_root=Path(settings.get("models_root", ".")),
        models=tuple((a, str(p)) for a, p in settings["models"].items()),
        policy=str(settings.get("policy", "continuous")),
        max_inflight=int(settings.get("max_inflight", 2)),
        job_timeout_s=float(settings.get("job_timeout", 30.0)),
        fault_injection=bool(settings.get("fault_injection", False)),
        drain_timeout_s=float(settings.get("drain_timeout", 30.0)),
        queue_depth=int(settings.get("queue_depth", 1024)),
        admission_timeout_s=float(settings.get("admission_timeout", 30.0)),
        decode_jobs_per_model=int(settings.get("decode_jobs_per_model", 1)),
    )


def _log_progress(p: LoadProgress) -> None:
    log.info("load %s generation %d: %s %s", p.alias, p.generation, p.state.value, p.message)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = merged_settings(args)
        logging.basicConfig(
            level=str(settings.get("log_level", "INFO")).upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        config = config_from(settings)
        listen = str(settings.get("listen", f"unix:run/board{config.board}.sock"))
        core = DeviceCore(config)
    except CalculetError as exc:
        print(f"calculet-daemon: {exc.kind.value}: {exc}", file=sys.stderr)
        return 2 if exc.kind.value == "invalid_argument" else 1
    try:
        core.start(progress=_log_progress)
        # Start-up objects live forever: keep them out of full collections (DESIGN.md section 9
        # measured 23-26 ms full-GC pauses as the p99 tail).
        gc.collect()
        gc.freeze()
        asyncio.run(
            serve(
                core,
                listen,
                max_message_bytes=int(settings.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)),
                grace_s=config.drain_timeout_s,
            )
        )
    except CalculetError as exc:
        print(f"calculet-daemon: {exc.kind.value}: {exc}", file=sys.stderr)
        core.close()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
