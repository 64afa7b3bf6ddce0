"""`calctl bench`: a serving benchmark against a gateway (OpenAI API, streamed) or daemons directly.

Definitions, flags and the JSON schema: docs/benchmarking.md. The harness lives in
`calculet.ops.bench`; this module turns flags into its objects, runs it on one asyncio loop and
writes the outputs: a rich table on stdout, `--json OUT` (or `--json` alone: the JSON on stdout
instead of the table), `--plot OUT.png`. Exit 0 when every measured request succeeded, 1 when one
failed (the outputs are written all the same) or the target could not be used, 2 on bad flags.

Data flow: flags -> `_Settings` (checked) -> backend (`GatewayBackend` over httpx, or
`DaemonBackend` over `AsyncDaemonClient`s with the TLS/token settings of `access.py`) + the board
targets whose Status is read (the `--daemon`s, or the gateway's `/ready` boards) -> workload ->
`runner.run_bench` -> `report.report_json` -> table / JSON / plot. With `--timing-package DIR` the
report also relates the run to the package's timing model (`relative.timing_json`: the limit and
every figure over the modelled device time at `--time-scale`; the policy from the first board's
Status). `calctl bench suite` (bench_suite.py) calls `measure` for each of its runs.

`--workload multiturn` runs conversations instead of independent requests (issue 19): its flags
(`calculet.ops.bench.multiturn.flags`) go through `_multiturn` and the multi-turn harness
(`calculet.ops.bench.multiturn`), through a gateway's chat API only; the report gains a `multiturn`
section. A flag of the other workload with it, or one of its flags without it, is a usage error.
`--workload structured` and `--workload tools` send schema'd chat answers or enforced tool calls
(`calculet.ops.bench.structured`) through a gateway's chat API, timed like `requests`, and check
each answer; the report gains a `validity` section.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calculet.client import AsyncDaemonClient
from calculet.common.errors import CalculetError, InvalidArgument
from calculet.common.secret_files import read_secret_lines
from calculet.ops.bench.arg_types import count_arg, non_negative_arg, positive_arg, typed_arg
from calculet.ops.bench.backend import BenchBackend, BenchSampling
from calculet.ops.bench.daemon_backend import DaemonBackend
from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.bench.discovery import first_answer, gateway_boards, model_vocab
from calculet.ops.bench.gateway_backend import GatewayAddress, GatewayBackend, open_http
from calculet.ops.bench.multiturn import flags as multiturn_flags
from calculet.ops.bench.multiturn.chat import ChatBackend
from calculet.ops.bench.multiturn.plot import write_turn_plot
from calculet.ops.bench.multiturn.report import multiturn_json
from calculet.ops.bench.multiturn.run import run_multiturn
from calculet.ops.bench.multiturn.text import TokenCounter
from calculet.ops.bench.multiturn.tokenizer import counter_from_file, counter_from_json
from calculet.ops.bench.multiturn.workload import build_workload
from calculet.ops.bench.plot import require_matplotlib, write_plot
from calculet.ops.bench.progress import progress_bar
from calculet.ops.bench.relative import TimingContext, timing_json
from calculet.ops.bench.report import report_json
from calculet.ops.bench.runner import BenchPlan, BenchResult, run_bench, warmup_concurrency
from calculet.ops.bench.schedule import ArrivalSchedule, ClosedLoop, OpenLoop
from calculet.ops.bench.slo import Slo
from calculet.ops.bench.structured.backend import StructuredBackend
from calculet.ops.bench.structured.report import validity_json
from calculet.ops.bench.structured.schemas import require_jsonschema
from calculet.ops.bench.structured.workload import StructuredKind, StructuredWorkload
from calculet.ops.bench.table import render_report
from calculet.ops.bench.wire_views import serving_reader, status_reader
from calculet.ops.bench.workload import BenchRequest, LengthSpec, cycle_to, load_jsonl, synthetic_requests
from calculet.ops.commands.access import DaemonAccess, access_from
from calculet.ops.commands.daemon_cmds import (
    EXIT_OK,
    UsageError,
    add_daemon_arguments,
    console,
    daemon_targets,
    problem,
)

COMMAND = ("bench",)
HELP = "Benchmark serving: TTFT, TPOT, ITL, E2E percentiles, throughput, goodput and device busy ratio."
DEFAULT_REQUESTS = 100
DEFAULT_LENGTH = 128
OBSERVE_TIMEOUT_S = 10.0  # a board that does not answer Status or GetModel in this long is reported n/a
STDOUT = "-"
REQUESTS, MULTITURN = "requests", "multiturn"
STRUCTURED_KINDS = {kind.value: kind for kind in StructuredKind}  # `structured`, `tools`
# A bounded schema's answer or one call ends within a few hundred tokens whatever the model writes.
DEFAULT_STRUCTURED_LENGTH = 512


def _length(flag: str) -> Callable[[str], LengthSpec]:
    return typed_arg(lambda text: LengthSpec.parse(text, flag))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target (one gateway, or daemons directly)")
    gateway_help = "gateway: http(s)://HOST:PORT or unix:PATH"
    target.add_argument("--gateway", type=typed_arg(GatewayAddress.parse), metavar="URL", help=gateway_help)
    target.add_argument("--api-key-file", metavar="FILE", help="gateway API key, first usable line of FILE")
    # Checked in `_settings`, not by argparse: `calctl bench suite` parses through this parser too.
    target.add_argument("--model", metavar="ALIAS", help="model alias to benchmark (required)")
    add_daemon_arguments(parser, json_output=False, many=True)
    load = parser.add_argument_group("load")
    shape = load.add_mutually_exclusive_group()
    shape.add_argument("--concurrency", type=count_arg(1), metavar="N", help="closed loop: N in flight (1)")
    shape.add_argument("--rate", type=positive_arg(allow_inf=True), metavar="R", help="open loop: R requests/s")
    load.add_argument("--burstiness", type=positive_arg(allow_inf=True), metavar="B", help="with --rate (1 = Poisson)")
    requests_help = f"measured requests ({DEFAULT_REQUESTS}; with --prompts, one per prompt)"
    load.add_argument("--requests", type=count_arg(1), metavar="N", help=requests_help)
    load.add_argument("--warmup", type=count_arg(0), default=0, metavar="N", help="warm-up requests, not counted (0)")
    work = parser.add_argument_group("workload")
    workload_help = (
        "independent requests; conversations of several turns; schema'd answers (structured) or enforced tool "
        "calls (tools), each checked; the last three through --gateway (requests)"
    )
    work.add_argument("--workload", choices=(REQUESTS, MULTITURN, *STRUCTURED_KINDS), help=workload_help)
    budget_help = "structured|tools: every request's thinking_token_budget (default: thinking off)"
    work.add_argument("--thinking-budget", type=count_arg(0), metavar="N", help=budget_help)
    for flag, what in (("--prompt-len", "random prompt tokens"), ("--output-len", "max_tokens")):
        length_help = f"{what}, fixed or uniform in LO..HI ({DEFAULT_LENGTH})"
        work.add_argument(flag, type=_length(flag), metavar="N|LO:HI", help=length_help)
    prompts_help = 'JSONL, one a line: {"prompt": str} or {"prompt_tokens": [int]}, optional "max_tokens"'
    work.add_argument("--prompts", type=Path, metavar="FILE", help=prompts_help)
    vocab_help = "random prompt token ids are < N (default: the model's vocabulary, from GetModel)"
    work.add_argument("--vocab", type=count_arg(1), metavar="N", help=vocab_help)
    work.add_argument("--ignore-eos", action="store_true", help="generate exactly max_tokens tokens")
    work.add_argument("--temperature", type=float, default=None, metavar="T", help="every request's (server default)")
    work.add_argument("--top-k", type=int, default=None, metavar="K", help="every request's top-k (server default)")
    work.add_argument("--top-p", type=float, default=None, metavar="P", help="every request's top-p (server default)")
    work.add_argument("--seed", type=count_arg(0), default=0, help="seed of workload, arrivals and sampling (0)")
    multiturn_flags.add_arguments(parser)
    out = parser.add_argument_group("report")
    out.add_argument("--slo", type=typed_arg(Slo.parse), metavar="ttft:MS,tpot:MS", help="goodput objectives")
    timeout_help = "seconds per call and between streamed bytes (600)"
    out.add_argument("--timeout", type=positive_arg(allow_inf=False), default=600.0, metavar="S", help=timeout_help)
    json_help = "write the JSON report to OUT; alone: print it instead of the table"
    out.add_argument("--json", nargs="?", const=STDOUT, metavar="OUT", help=json_help)
    out.add_argument("--plot", type=Path, metavar="OUT.png", help="plot latency percentiles and throughput")
    progress_help = "progress bar on stderr (default: when stdout is a terminal)"
    out.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help=progress_help)
    model = parser.add_argument_group("timing model (calsim)")
    package_help = "the package the boards serve: relate every figure to its timing model and give the limit"
    model.add_argument("--timing-package", type=Path, metavar="DIR", help=package_help)
    scale_help = "the boards' calsim --time-scale, wall s per modelled s (1; needs --timing-package)"
    model.add_argument("--time-scale", type=non_negative_arg, metavar="F", help=scale_help)


@dataclass(frozen=True)
class _Settings:
    """The checked flags."""

    args: argparse.Namespace
    access: DaemonAccess
    gateway: GatewayAddress | None
    api_key: str | None
    schedule: ArrivalSchedule
    slo: Slo
    device_model: DeviceModel | None


def _settings(args: argparse.Namespace) -> _Settings:
    """Raises: UsageError: no --model; InvalidArgument: flags that do not go together, an unreadable
    key file, bad TLS; ManifestError: --timing-package has no readable manifest."""
    if args.model is None:
        raise UsageError("the following arguments are required: --model")
    _check_workload_flags(args)
    if args.time_scale is not None and args.timing_package is None:
        raise InvalidArgument("--time-scale says how fast the --timing-package runs: give --timing-package too")
    if args.burstiness is not None and args.rate is None:
        raise InvalidArgument("--burstiness shapes the arrivals of --rate: give --rate too")
    if args.api_key_file is not None and args.gateway is None:
        raise InvalidArgument("--api-key-file is for --gateway")
    gateway: GatewayAddress | None = args.gateway
    api_key = read_secret_lines(Path(args.api_key_file), "api-key-file")[0] if args.api_key_file else None
    if args.rate is not None:
        schedule: ArrivalSchedule = OpenLoop(args.rate, args.burstiness or 1.0, args.seed)
    else:
        schedule = ClosedLoop(args.concurrency or 1)
    model = DeviceModel.from_package(args.timing_package) if args.timing_package is not None else None
    return _Settings(args, access_from(args), gateway, api_key, schedule, args.slo or Slo(), model)


def _check_workload_flags(args: argparse.Namespace) -> None:
    """Raises: UsageError: a flag of another workload, or a chat workload without --gateway."""
    structured = args.workload in STRUCTURED_KINDS
    if args.thinking_budget is not None and not structured:
        raise UsageError("--thinking-budget: only with --workload structured or tools")
    if structured:
        _check_structured_flags(args)
    if args.workload != MULTITURN:
        mine = multiturn_flags.given(args)
        if mine:
            raise UsageError(f"{', '.join(mine)}: only with --workload multiturn")
        return
    theirs = multiturn_flags.foreign(args)
    if theirs:
        raise UsageError(
            f"{', '.join(theirs)}: not with --workload multiturn (its load is --users, --turns, --think-time; "
            "its lengths --system-tokens, --user-tokens, --answer-tokens)"
        )
    if args.gateway is None:
        raise UsageError("--workload multiturn talks to a gateway's chat API: give --gateway URL")


def _check_structured_flags(args: argparse.Namespace) -> None:
    """Raises: UsageError: a flag that does not apply to checked chat answers, or no --gateway."""
    given = [flag for flag, value in (("--prompts", args.prompts), ("--prompt-len", args.prompt_len),
             ("--vocab", args.vocab), ("--ignore-eos", args.ignore_eos or None)) if value is not None]  # fmt: skip
    if given:
        raise UsageError(f"{', '.join(given)}: not with --workload {args.workload} (its prompts are chat messages)")
    if args.gateway is None:
        raise UsageError(f"--workload {args.workload} talks to a gateway's chat API: give --gateway URL")
    require_jsonschema()


def _structured(args: argparse.Namespace) -> StructuredWorkload | None:
    """The checked chat workload of `--workload structured|tools`, else None."""
    kind = STRUCTURED_KINDS.get(args.workload or "")
    return StructuredWorkload(kind, args.seed, args.thinking_budget) if kind is not None else None


def _open_client(settings: _Settings, *, observe: bool = False) -> Callable[[str], AsyncDaemonClient]:
    """Clients of the daemons; `observe`: for Status and GetModel, with at most `OBSERVE_TIMEOUT_S`."""
    access, timeout = settings.access, settings.args.timeout
    if observe:
        timeout = min(timeout, OBSERVE_TIMEOUT_S)
    return lambda target: AsyncDaemonClient(target, timeout=timeout, token=access.token, tls=access.tls)


def _sampling(args: argparse.Namespace) -> BenchSampling:
    return BenchSampling(args.temperature, args.top_k, args.top_p)


async def _backend(settings: _Settings) -> tuple[BenchBackend, list[str]]:
    """The backend and the daemons whose device figures are read (deduplicated, in order)."""
    args = settings.args
    if settings.gateway is None:
        targets = list(dict.fromkeys(daemon_targets(args)))
        clients = [_open_client(settings)(t) for t in targets]
        sampling = _sampling(args)
        return DaemonBackend(
            clients, args.model, ignore_eos=args.ignore_eos, seed=args.seed, sampling=sampling
        ), targets
    http = open_http(settings.gateway, timeout_s=args.timeout, api_key=settings.api_key)
    structured = _structured(args)
    backend: BenchBackend
    if structured is not None:
        backend = StructuredBackend(
            http, settings.gateway, args.model, structured, seed=args.seed, sampling=_sampling(args)
        )
    else:
        backend = GatewayBackend(
            http, settings.gateway, args.model, ignore_eos=args.ignore_eos, seed=args.seed, sampling=_sampling(args)
        )
    try:
        targets = list(dict.fromkeys(args.daemon or await gateway_boards(http, settings.gateway.text)))
    except CalculetError:
        await backend.close()
        raise
    return backend, targets


async def _workload(settings: _Settings, targets: list[str]) -> tuple[list[BenchRequest], dict[str, Any]]:
    """warm-up + measured requests, and their description for the report."""
    args = settings.args
    rng = random.Random(f"calctl-bench:{args.seed}:workload")
    fixed = LengthSpec(DEFAULT_LENGTH, DEFAULT_LENGTH)
    prompt_len, output_len = args.prompt_len or fixed, args.output_len or fixed
    structured = _structured(args)
    if structured is not None:
        total = args.warmup + (args.requests or DEFAULT_REQUESTS)
        max_tokens = args.output_len.draw(rng) if args.output_len else DEFAULT_STRUCTURED_LENGTH
        return structured.requests(total, max_tokens), structured.describe() | {"output_len": [max_tokens] * 2}
    if args.prompts is not None:
        loaded = load_jsonl(args.prompts, output_len, rng)
        total = args.warmup + (args.requests or len(loaded))
        described = {"source": "file", "path": str(args.prompts), "prompts": len(loaded)}
        return cycle_to(loaded, total), described | {"output_len": output_len.as_list()}
    vocab = args.vocab
    if vocab is None:
        open_client = _open_client(settings, observe=True)

        async def vocab_of(target: str) -> int:
            async with open_client(target) as client:
                return (await client.get_model(args.model)).vocab_size

        vocab = await model_vocab(targets, vocab_of)
    total = args.warmup + (args.requests or DEFAULT_REQUESTS)
    requests = synthetic_requests(total, prompt_len, output_len, vocab, rng)
    described = {"source": "random", "prompt_len": prompt_len.as_list(), "vocab": vocab}
    return requests, described | {"output_len": output_len.as_list()}


def _config(
    settings: _Settings, target: dict[str, object], targets: list[str], workload: dict[str, Any]
) -> dict[str, Any]:
    """The report's `config`: `target` is the backend's description, `targets` the status daemons."""
    args = settings.args
    return {
        "target": target | {"status_daemons": targets},
        "model": args.model,
        "warmup": args.warmup,
        "schedule": settings.schedule.describe(),
        "workload": workload,
        "ignore_eos": args.ignore_eos,
        "sampling": _sampling(args).fields(),
        "seed": args.seed,
        "slo_ms": settings.slo.as_ms(),
        "timeout_s": args.timeout,
    }


async def _timing_context(settings: _Settings, targets: list[str]) -> TimingContext | None:
    """The timing model of the run, the policy read from the first board's Status (None without
    --timing-package).

    Raises:
        InvalidArgument: no board to read the policy from; CalculetError: Status failed.
    """
    args, model = settings.args, settings.device_model
    if model is None:
        return None
    if not targets:
        raise InvalidArgument("--timing-package: no board to read the policy from; give --daemon")
    serving = await serving_reader(_open_client(settings, observe=True))(targets[0])
    scale = 1.0 if args.time_scale is None else args.time_scale
    return TimingContext(str(args.timing_package), model, serving, scale, len(targets))


async def _bench(settings: _Settings) -> tuple[BenchResult, dict[str, Any]]:
    args = settings.args
    backend, targets = await _backend(settings)
    try:
        timing = await _timing_context(settings, targets)
        requests, workload = await _workload(settings, targets)
        requests = await backend.prepare(requests)
        plan = BenchPlan(
            warmup=requests[: args.warmup],
            measured=requests[args.warmup :],
            slo=settings.slo,
            board_targets=targets,
            warmup_concurrency=warmup_concurrency(settings.schedule),
        )
        progress = sys.stdout.isatty() if args.progress is None else args.progress
        with progress_bar(len(plan.measured), enabled=progress) as on_done:
            status_of = status_reader(_open_client(settings, observe=True))
            result = await run_bench(backend, settings.schedule, plan, status_of, on_done)
    finally:
        await backend.close()
    report = report_json(result, _config(settings, backend.describe(), targets, workload))
    if isinstance(backend, StructuredBackend):
        report["validity"] = validity_json(backend.verdicts, [r.index for r in plan.measured])
    if timing is not None:
        concurrency = settings.schedule.concurrency if isinstance(settings.schedule, ClosedLoop) else None
        report["timing_model"] = timing_json(timing, result, concurrency)
    return result, report


async def _token_counter(settings: _Settings, targets: list[str]) -> TokenCounter:
    """The model's tokenizer: `--tokenizer FILE`, else the first board's GetModel.

    Raises:
        InvalidArgument, FailedPrecondition: the file; Unavailable: no board answered.
    """
    args = settings.args
    if args.tokenizer is not None:
        return counter_from_file(args.tokenizer)
    open_client = _open_client(settings, observe=True)

    async def tokenizer_of(target: str) -> bytes:
        async with open_client(target) as client:
            return (await client.get_model(args.model)).tokenizer_json

    data = await first_answer(targets, tokenizer_of, "the model's tokenizer", "give --tokenizer FILE")
    return counter_from_json(data, f"model {args.model!r}'s tokenizer.json")


async def _multiturn(settings: _Settings) -> tuple[BenchResult, dict[str, Any]]:
    """The `--workload multiturn` run: conversations through the gateway's chat API."""
    args, gateway = settings.args, settings.gateway
    assert gateway is not None  # _check_workload_flags
    spec = multiturn_flags.spec_from(args)
    http = open_http(gateway, timeout_s=args.timeout, api_key=settings.api_key)
    backend = ChatBackend(http, gateway, args.model, seed=args.seed, send_user=bool(args.send_user))
    try:
        targets = list(dict.fromkeys(args.daemon or await gateway_boards(http, gateway.text)))
        timing = await _timing_context(settings, targets)
        workload = build_workload(spec, await _token_counter(settings, targets), args.warmup)
        progress = sys.stdout.isatty() if args.progress is None else args.progress
        with progress_bar(spec.users * spec.turns, enabled=progress) as on_done:
            status_of = status_reader(_open_client(settings, observe=True))
            done = run_multiturn(workload, backend.send, settings.slo, targets, status_of, lambda t: on_done(t.record))
            result = await done
    finally:
        await backend.close()
    config = _config(settings, backend.describe(), targets, workload.describe()) | {"ignore_eos": True}
    config["schedule"] = {"mode": "conversations", "users": spec.users, "turns": spec.turns}
    report = report_json(result.bench, config)
    if timing is not None:
        report["timing_model"] = timing_json(timing, result.bench, None)
    duration = result.bench.summary.duration_s
    report["multiturn"] = multiturn_json(result.turns, spec.users, spec.turns, timing, duration)
    return result.bench, report


def _measure(settings: _Settings) -> tuple[BenchResult, dict[str, Any]]:
    run_it = _multiturn if settings.args.workload == MULTITURN else _bench
    return asyncio.run(run_it(settings))


def measure(args: argparse.Namespace) -> tuple[BenchResult, dict[str, Any]]:
    """Run the benchmark `args` (parsed by calctl's parser) describe; no output written.

    Returns:
        The result and its JSON report.

    Raises:
        UsageError, CalculetError: as `run` (bad flags, unusable target).
    """
    return _measure(_settings(args))


def run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if args.plot is not None:
        require_matplotlib()
    result, report = _measure(settings)
    text = json.dumps(report, indent=2)
    if args.json == STDOUT:
        print(text)
    else:
        console().print(render_report(report))
        if args.json is not None:
            Path(args.json).write_text(text + "\n", encoding="utf-8")
    if args.plot is not None and "multiturn" in report:
        write_turn_plot(args.plot, report, result.records, result.window_start)
    elif args.plot is not None:
        write_plot(args.plot, report, result.records, result.window_start)
    summary = result.summary
    if summary.failed:
        first = summary.errors[0] if summary.errors else ""
        return problem(f"bench: {summary.failed} of {summary.requests} requests failed; first: {first}")
    return EXIT_OK
