"""The suite's matrix: which fleets run (configurations), which workloads each runs, at which
concurrencies, through which targets; and its expansion into `SuiteRun`s.

Configurations (`FleetSpec`, one local fleet each): `serial` (`--policy serial`, today's path, on a
package with decode batch 1 and its default lanes, so it holds the whole context); `if1-bB` and
`if2-bB` (continuous batching, `--max-inflight 1` / `2`, on a package whose ONLY decode batch is B,
with as many lanes as the largest batch of the suite, so only the compiled batch differs);
`if2-bB-xK` (K boards behind one gateway, B the largest batch). Every run goes through the gateway;
on `serial` and `if2-bB` (largest B) the `short` workload also runs directly against the daemons
(`daemon` target), for the gateway's own cost.

Workloads (`WorkloadSpec`, the docs/sources.md 001 §12 matrix scaled to fit): `short` (prompts uniform
in a short range), `long` (every prompt long), `mixed` (10 % long, 90 % short), and the `len-PxO`
grid of docs/sources.md 001 §12.1 (prompt P, output O, concurrency 1). A long prompt is 001 §12.1's
40,900 tokens clipped to a package's context minus the output (`scale_to_context`), so it fits the
lanes the package has: to the SMALLEST context of the matrix's packages, so every configuration
runs the same requests (the length grid: to its own fleet's). Concurrency is PER BOARD: K boards
run K times as many clients, so 1, 2 and 4 boards are compared at equal load per board. Every
request asks for exactly its output tokens (`--ignore-eos`).

`quick_matrix` is a small subset (a few minutes on 2 cores at time scale 1); `full_matrix` the whole
matrix. Data flow: matrix -> `expand` (with each fleet's package context) -> runs -> runner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from calculet.common.errors import InvalidArgument
from calculet.ops.bench.limit import Policy

GATEWAY, DAEMON = "gateway", "daemon"
SEED_LONG_PROMPT = 40_900  # docs/sources.md 001 §12.1's longest prompt
SEED_PROMPTS = (1, 16, 128, 512, 2048, 4096, 8192, 16384, 32768, SEED_LONG_PROMPT)
SEED_OUTPUTS = (1, 32, 128, 512)
LONG_FRACTION_MIXED = 0.1
MAX_WARMUP = 16
SEED_RUNS = 20  # docs/sources.md 001 §12.1: at least 20 measured runs per cell ...
SEED_WARMUPS = 3  # ... after 3 warm-ups
LENGTH_GRID_SCALE_FLOOR = 0.05


@dataclass(frozen=True)
class FleetSpec:
    """One configuration: a local fleet of `boards` daemons (and the gateway) on one package."""

    name: str
    policy: Policy
    max_inflight: int
    decode_batch: int
    boards: int
    targets: tuple[str, ...] = (GATEWAY,)
    scale_floor: float | None = None  # lowest automatic time scale (None: estimate.AUTO_FLOOR)

    @property
    def package_key(self) -> str:
        """Which package it serves: `serial` (batch 1, default lanes) or `bB` (batch B only)."""
        return "serial" if self.policy is Policy.SERIAL else f"b{self.decode_batch}"

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "policy": self.policy.value,
            "max_inflight": self.max_inflight,
            "decode_batch": self.decode_batch,
            "boards": self.boards,
        }


@dataclass(frozen=True)
class WorkloadSpec:
    """One workload: short prompts uniform in `short_prompt`, a `long_fraction` of them `long_prompt`
    tokens instead (before scaling to the context), `output` tokens each, at each per-board
    concurrency; `per_client` requests per client, at least `min_requests`."""

    name: str
    short_prompt: tuple[int, int]
    output: int
    concurrency: tuple[int, ...]
    long_prompt: int = 0
    long_fraction: float = 0.0
    per_client: int = 4
    min_requests: int = 16
    own_context: bool = False  # scaled to its fleet's package, not to the matrix's smallest context
    direct: bool = False  # also run against the daemons directly where the fleet has that target
    min_warmup: int = 1  # warm-up requests at least (one a client otherwise)

    def __post_init__(self) -> None:
        lo, hi = self.short_prompt
        if not 1 <= lo <= hi or self.output < 1 or not self.concurrency or min(self.concurrency) < 1:
            raise InvalidArgument(f"workload {self.name}: bad lengths or concurrency")
        if not 0.0 <= self.long_fraction <= 1.0 or (self.long_fraction > 0 and self.long_prompt < 1):
            raise InvalidArgument(f"workload {self.name}: long fraction in 0..1 needs a long prompt")

    def scale_to_context(self, context: int) -> WorkloadSpec:
        """Lengths clipped so prompt + output fit `context` (output at most context - 1)."""
        output = min(self.output, context - 1)
        room = context - output
        lo, hi = self.short_prompt
        short = (min(lo, room), min(hi, room))
        return replace(self, output=output, short_prompt=short, long_prompt=min(self.long_prompt, room))

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "short_prompt": list(self.short_prompt),
            "long_prompt": self.long_prompt,
            "long_fraction": self.long_fraction,
            "output": self.output,
        }


@dataclass(frozen=True)
class SuiteRun:
    """One benchmark run: a workload (already scaled) on a fleet, at a total concurrency, through
    one target, with its measured and warm-up request counts."""

    fleet: FleetSpec
    workload: WorkloadSpec
    concurrency: int
    target: str
    requests: int
    warmup: int

    @property
    def name(self) -> str:
        return f"{self.fleet.name}.{self.workload.name}.c{self.concurrency}.{self.target}"


@dataclass(frozen=True)
class MatrixEntry:
    """A fleet and the workloads it runs."""

    fleet: FleetSpec
    workloads: tuple[WorkloadSpec, ...]


def _short(
    output: int, concurrency: tuple[int, ...], prompt: tuple[int, int], per_client: int, least: int
) -> WorkloadSpec:
    return WorkloadSpec("short", prompt, output, concurrency, per_client=per_client, min_requests=least, direct=True)


def length_grid(
    prompts: Sequence[int] = SEED_PROMPTS, outputs: Sequence[int] = SEED_OUTPUTS
) -> tuple[WorkloadSpec, ...]:
    """docs/sources.md 001 §12.1: every prompt x output at concurrency 1, `SEED_RUNS` measured requests
    after `SEED_WARMUPS` warm-ups, each prompt clipped to its own fleet's context (the serial package
    holds the whole 40,960 tokens)."""
    return tuple(
        WorkloadSpec(
            f"len-{p}x{o}",
            (p, p),
            o,
            (1,),
            per_client=1,
            min_requests=SEED_RUNS,
            own_context=True,
            min_warmup=SEED_WARMUPS,
        )
        for p in prompts
        for o in outputs
    )


def _fleets(batches: Sequence[int], boards: Sequence[int], inflights: Sequence[int]) -> list[FleetSpec]:
    top = max(batches)
    out = [FleetSpec("serial", Policy.SERIAL, 1, 1, 1, (GATEWAY, DAEMON))]
    for inflight in inflights:
        for b in batches:
            targets = (GATEWAY, DAEMON) if inflight == 2 and b == top else (GATEWAY,)
            out.append(FleetSpec(f"if{inflight}-b{b}", Policy.CONTINUOUS, inflight, b, 1, targets))
    out += [FleetSpec(f"if2-b{top}-x{k}", Policy.CONTINUOUS, 2, top, k) for k in boards]
    return out


def quick_matrix(batches: Sequence[int]) -> tuple[MatrixEntry, ...]:
    """A few minutes on 2 cores: serial, in-flight 1 and 2 at the largest batch (1 and 2 boards),
    short prompts at concurrency 1 and 16, and one 10 %-long run."""
    top = max(batches)
    short = _short(32, (1, 16), (16, 64), per_client=2, least=8)
    mixed = WorkloadSpec("mixed", (16, 64), 32, (16,), 1024, LONG_FRACTION_MIXED, per_client=2, min_requests=20)
    entries = []
    for fleet in _fleets([top], [2], [1, 2]):
        if fleet.boards > 1:
            entries.append(MatrixEntry(fleet, (replace(short, concurrency=(16,)),)))
        else:
            entries.append(MatrixEntry(fleet, (short, mixed) if fleet.name == f"if2-b{top}" else (short,)))
    return tuple(entries)


def full_matrix(batches: Sequence[int]) -> tuple[MatrixEntry, ...]:
    """Every configuration: short at concurrency 1..32, mixed at 4 and 16, long at 1 and 4 (serial and
    the largest batch in flight 2); multi-board fleets short at 4 and 16 per board; and the length
    grid on a serial fleet of its own (`serial-len`), whose package holds the whole context. Short,
    mixed and the length grid measure at least `SEED_RUNS` requests after at least `SEED_WARMUPS`
    warm-ups (docs/sources.md 001 §12.1); `long` keeps 2 (each of its prompts is 40,900 tokens). The
    grid is prefill-bound at concurrency 1 (a 40,900-token prompt is about 1,800 modelled seconds),
    so its fleet may run down to time scale `LENGTH_GRID_SCALE_FLOOR`: its host work is a few
    milliseconds a request, far below the CPU limit, and the TPOT excess (ms) does not depend on it."""
    top = max(batches)
    short = replace(
        _short(128, (1, 2, 4, 8, 16, 32), (16, 128), per_client=4, least=SEED_RUNS), min_warmup=SEED_WARMUPS
    )
    mixed = WorkloadSpec(
        "mixed", (16, 128), 128, (4, 16), SEED_LONG_PROMPT, LONG_FRACTION_MIXED, 2, SEED_RUNS, min_warmup=SEED_WARMUPS
    )
    long = WorkloadSpec("long", (16, 128), 128, (1, 4), SEED_LONG_PROMPT, 1.0, per_client=1, min_requests=2)
    entries = []
    for fleet in _fleets(batches, [2, 4], [1, 2]):
        if fleet.boards > 1:
            entries.append(MatrixEntry(fleet, (replace(short, concurrency=(4, 16)),)))
        elif fleet.policy is Policy.SERIAL or (fleet.decode_batch == top and fleet.max_inflight == 2):
            entries.append(MatrixEntry(fleet, (short, mixed, long)))
        else:
            entries.append(MatrixEntry(fleet, (short, mixed)))
    grid = FleetSpec("serial-len", Policy.SERIAL, 1, 1, 1, scale_floor=LENGTH_GRID_SCALE_FLOOR)
    entries.append(MatrixEntry(grid, length_grid()))
    return tuple(entries)


def request_counts(workload: WorkloadSpec, concurrency: int, requests: int | None) -> tuple[int, int]:
    """(measured, warm-up) requests of a run: `requests` when given, else `per_client` per client
    and at least `min_requests`; one warm-up request per client, at most `MAX_WARMUP`, at least the
    workload's `min_warmup`."""
    measured = requests if requests is not None else max(workload.min_requests, workload.per_client * concurrency)
    return measured, max(workload.min_warmup, min(concurrency, MAX_WARMUP))


@dataclass(frozen=True)
class Selection:
    """Narrowing of the matrix from the command line (None = everything)."""

    configs: frozenset[str] | None = None
    workloads: frozenset[str] | None = None
    concurrency: tuple[int, ...] | None = None
    targets: frozenset[str] | None = None
    requests: int | None = None

    def check(self, entries: Sequence[MatrixEntry]) -> None:
        """Raises: InvalidArgument: a named configuration, workload or target is not in the matrix."""
        known = {
            "configuration": {e.fleet.name for e in entries},
            "workload": {w.name for e in entries for w in e.workloads},
            "target": {GATEWAY, DAEMON},
        }
        for what, chosen in (("configuration", self.configs), ("workload", self.workloads), ("target", self.targets)):
            unknown = sorted((chosen or set()) - known[what])
            if unknown:
                names = ", ".join(sorted(known[what]))
                raise InvalidArgument(f"unknown {what} {', '.join(unknown)} (this matrix has: {names})")


def expand(entries: Sequence[MatrixEntry], context_of: Callable[[FleetSpec], int], pick: Selection) -> list[SuiteRun]:
    """Every run of the selected part of the matrix, fleet by fleet, in matrix order.

    Args:
        entries: the matrix.
        context_of: the context of each fleet's package. Workloads are clipped to the smallest of
            them (so every configuration runs the same requests), the length grid to its own.
        pick: the selection.

    Raises:
        InvalidArgument: see `Selection.check`, or the selection leaves no run.
    """
    pick.check(entries)
    shared = [context_of(e.fleet) for e in entries if any(not w.own_context for w in e.workloads)]
    common = min(shared, default=0)
    runs = []
    for entry in entries:
        fleet = entry.fleet
        if pick.configs is not None and fleet.name not in pick.configs:
            continue
        for spec in entry.workloads:
            if pick.workloads is not None and spec.name not in pick.workloads:
                continue
            workload = spec.scale_to_context(context_of(fleet) if spec.own_context else common)
            for per_board in pick.concurrency or workload.concurrency:
                total = per_board * fleet.boards
                measured, warmup = request_counts(workload, total, pick.requests)
                for target in fleet.targets:
                    if (target == GATEWAY or workload.direct) and (pick.targets is None or target in pick.targets):
                        runs.append(SuiteRun(fleet, workload, total, target, measured, warmup))
    if not runs:
        raise InvalidArgument("the selection leaves no run")
    return runs
