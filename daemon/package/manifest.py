"""The model package manifest `calculet-package.json`, schema version 1 (docs/package.md).

This module owns the in-memory form of a manifest: frozen dataclasses, `from_dict` (strict
structural parsing, first problem raises `ManifestError`) and `to_dict` (the exact JSON form).
Semantic checks across fields and files (hashes, roles, memory, compatibility) belong to
`calculet.daemon.package.validate`, which reports every problem at once. Every field is
documented in docs/package.md.
"""

from __future__ import annotations

import errno
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from calculet.common.errors import FailedPrecondition
from calculet.daemon.package.fs import FileTooLarge, NotRegularFile, read_regular
from calculet.daemon.package.logits_output import LogitsOutput

SCHEMA_VERSION = 1
MANIFEST_NAME = "calculet-package.json"
KERNELS = ("numeric", "synthetic")  # calsim's kernel kinds: what the offline validator assumes by default
SUBMODEL_ROLES = ("prefill", "decode")
DTYPES = ("int32", "uint32", "bf16", "fp16", "fp32", "int8", "uint8")
# A real manifest is tens of KiB (Qwen3-30B-A3B: 67 files); the cap is checked before parsing and
# leaves room for an inline chat template (at most 1 MiB) and thousands of file entries.
MAX_MANIFEST_BYTES = 4 << 20
# Schema v1 nests 4 containers deep (manifest.golden.prefill_top[i]); unknown fields get room, but
# no more than this, so nothing downstream recurses on attacker-chosen depth.
MAX_MANIFEST_DEPTH = 32
# Every integer of the schema is a count, id, size or mask a board holds in 64 bits.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class ManifestError(FailedPrecondition):
    """The manifest is missing, unreadable, not JSON, or structurally wrong.

    Attributes:
        code: the validator code (docs/package.md) that names the defect; structural problems
            found by `from_dict` use `schema.wrong_type`.
    """

    def __init__(self, message: str, code: str = "schema.wrong_type") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Architecture:
    """Transformer geometry (docs/sources.md 001 §5 for Qwen3-30B-A3B).

    A mixture-of-experts model has `experts` > 0 routed experts of width `expert_intermediate`,
    `experts_per_token` active; a dense model (Qwen3-4B) has `experts` = `experts_per_token` =
    `expert_intermediate` = 0 and one FFN of width `intermediate_size` per layer. `tied_embeddings`:
    the output head reuses the input embedding (one matrix in the parameters, read by both).
    """

    family: str
    layers: int
    hidden_size: int
    q_heads: int
    kv_heads: int
    head_dim: int
    experts: int
    experts_per_token: int
    expert_intermediate: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    intermediate_size: int = 0
    tied_embeddings: bool = False

    @property
    def dense(self) -> bool:
        """True for a dense model (no routed experts)."""
        return self.experts == 0


@dataclass(frozen=True)
class TensorDecl:
    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str = "row-major"


@dataclass(frozen=True)
class SubmodelDecl:
    """One calbin submodel. `smodel_type` is the vendor's label, kept to catch mislabels.

    `prefill_at_offset` (prefill submodels only): whether the graph runs a prefill after `past_kv_len`
    tokens already in the lane (a non-zero offset), so new tokens attend over KV a previous job
    wrote. None: not declared (absent from the manifest), read as no; jump-forward over a
    constraint's forced tokens runs only where it is True (docs/package.md `submodels[]`)."""

    name: str
    role: str
    smodel_type: str
    batch: int
    max_tokens: int
    context: int
    folder: str
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    csr: dict[str, str] = field(default_factory=dict)
    prefill_at_offset: bool | None = None


@dataclass(frozen=True)
class KVDecl:
    """KV cache layout: `lanes` lanes of `lane_context` tokens, `bytes_per_token` per lane-token
    across the whole board (layers x kv_heads x 2 x head_dim x dtype bytes)."""

    dtype: str
    layout: str
    lanes: int
    lane_context: int
    bytes_per_token: int
    split: str  # how KV is divided over chips: "kv_heads"


@dataclass(frozen=True)
class ChipMemoryDecl:
    chip: int
    chip_mask: int
    param_dram_bytes: int
    param_sram_bytes: int
    workspace_bytes: int


@dataclass(frozen=True)
class MemoryDecl:
    """Per-chip memory plan. `device_memory_required_bytes` is the vendor's board-wide figure."""

    chips: tuple[ChipMemoryDecl, ...]
    device_memory_required_bytes: int


# How chips share a model (docs/sources.md 000 §11): tensor, expert, pipeline parallel, or tensor and
# expert together; `none` for a package on one chip. `tensor` is the spelling of packages built
# before the check: read as `tp`, with a warning (`topology.parallelism_legacy`).
PARALLELISMS = ("tp", "ep", "pp", "tp+ep")
SINGLE_CHIP = "none"
LEGACY_PARALLELISM = {"tensor": "tp"}
# ASSUMPTION (no figure in docs/sources.md): the chiplet link a package does not name runs at 16 GB/s
# (twice the board's 8 GB/s PCIe, `timing.h2d_gbps`) and a cross-chip synchronisation costs 10 us.
DEFAULT_D2D_LINK_GBPS = 16.0
DEFAULT_D2D_SYNC_US = 10.0


@dataclass(frozen=True)
class D2DDecl:
    """Cross-chip (D2D) traffic of the calbin, what calsim's timing charges for it and Status counts.

    Attributes:
        bytes_per_token: bytes that cross between chips per token a job computes: per compiled row
            of a decode job (a static graph moves masked rows too), per new token of a prefill job
            (its D2D is dynamic, cut to the sequence: docs/sources.md 003 §11).
        syncs_per_job: cross-chip synchronisations one job's graph runs (gathers/reduces per layer,
            docs/sources.md 001 §5 counts 146 sync ops); each costs `sync_us` whatever the bytes.
        link_gbps: the link's rate, gigabytes (1e9 B) per second.
        sync_us: microseconds one synchronisation costs.
    """

    bytes_per_token: int
    syncs_per_job: int = 0
    link_gbps: float = DEFAULT_D2D_LINK_GBPS
    sync_us: float = DEFAULT_D2D_SYNC_US


@dataclass(frozen=True)
class Topology:
    """The chips a calbin runs on and how they share it.

    `parallelism`: one of `PARALLELISMS` on several chips, `none` on one (validator:
    `topology.parallelism`). `d2d`: its cross-chip traffic; None: not declared (a package without it
    has none modelled; today's measured timing already holds its link time)."""

    chips: int
    chip_masks: tuple[int, ...]
    parallelism: str
    d2d: D2DDecl | None = None


@dataclass(frozen=True)
class CompatRow:
    """One row of the compatibility matrix: a Runtime x driver x firmware combination (each a
    `>=A,<B` range, `*` for any) the package is known to work on, and whether it may share the board
    with another configured calbin there (docs/sources.md 000 §9, §17: two resident calbins need
    driver 1.0.0 and a matrix that says so)."""

    runtime: str
    driver: str
    firmware: str
    co_resident: bool = False


@dataclass(frozen=True)
class Compatibility:
    """Runtime/driver requirements as `>=A,<B` ranges, the compiler that produced the calbin, and
    the compatibility matrix (empty: the package states none, and never shares a board)."""

    runtime: str
    driver: str
    compiler: dict[str, str] = field(default_factory=dict)
    matrix: tuple[CompatRow, ...] = ()


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    role: str  # params | command | elf | helper | metadata | tokenizer | weights


@dataclass(frozen=True)
class TokenizerDecl:
    path: str
    chat_template: str
    model_max_length: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None
    pad_token_id: int | None = None


@dataclass(frozen=True)
class GoldenDecl:
    """Expected outputs checked while Warming: greedy continuation of a fixed prompt.

    Attributes:
        prompt_tokens: prefill input.
        prefill_top: `[token, logit]` pairs, the top logits after prefill, descending.
        decode_tokens: greedy tokens produced by prefill then decode steps (first one from prefill).
        logit_atol: absolute tolerance for the logits in `prefill_top`.
    """

    prompt_tokens: tuple[int, ...]
    prefill_top: tuple[tuple[int, float], ...]
    decode_tokens: tuple[int, ...]
    logit_atol: float


# The linear decode model's fields, replaced by `TimingDecl.decode_curve`: a manifest whose timing
# still declares them (and no curve) is refused with code `timing.legacy_line` and told to rebuild.
LEGACY_TIMING_FIELDS = ("decode_ms_short", "decode_ms_long", "long_context")
LEGACY_TIMING_MESSAGE = (
    "timing declares the retired linear decode model (decode_ms_short, decode_ms_long, long_context);"
    " this build reads timing.decode_curve, a table of {context, ms_per_token} points: rebuild the package"
    " (calctl package build-sim)"
)
MAX_DECODE_CURVE_POINTS = 1024  # a curve is a handful of measured points; calsim walks it per prefill job


@dataclass(frozen=True)
class DecodePoint:
    """One point of the decode curve: a batch-1 decode token whose row attends over `context` KV
    entries takes `ms_per_token` milliseconds."""

    context: int
    ms_per_token: float


@dataclass(frozen=True)
class TimingDecl:
    """calsim timing model; every figure's source is in `sources` (`calculet.daemon.calsim.timing`
    has the formulas and the reasoning behind them).

    decode one token, batch 1, at KV length L: `decode_curve` interpolated piecewise-linearly
    between its points, flat outside them (points sorted by strictly increasing context, ms
    non-decreasing, at least 2, the last at or beyond the package context); batch B: times
    `1 + batch_alpha * (B - 1)`; prefill n tokens after past p: `prefill_fixed_ms +
    prefill_ms_per_token * n` plus, for the i-th new token, the curve's growth `t1(p + i) - t1(0)`
    (its attention reads); copies at `h2d_gbps` / `d2h_gbps`.
    """

    decode_curve: tuple[DecodePoint, ...]
    prefill_fixed_ms: float
    prefill_ms_per_token: float
    batch_alpha: float
    h2d_gbps: float
    d2h_gbps: float
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PackageManifest:
    schema_version: int
    name: str
    model_role: str
    kernel: str
    architecture: Architecture
    quantization: str
    topology: Topology
    kv: KVDecl
    submodels: tuple[SubmodelDecl, ...]
    memory: MemoryDecl
    compatibility: Compatibility
    files: tuple[FileEntry, ...]
    tokenizer: TokenizerDecl
    golden: GoldenDecl
    timing: TimingDecl
    synthetic_seed: int = 0
    logits_output: LogitsOutput = field(default_factory=LogitsOutput)

    def submodel(self, name: str) -> SubmodelDecl:
        return next(s for s in self.submodels if s.name == name)

    def submodels_for(self, role: str) -> list[SubmodelDecl]:
        return sorted((s for s in self.submodels if s.role == role), key=lambda s: (s.batch, s.max_tokens))

    @property
    def context(self) -> int:
        """Tokens a sequence may hold: the smallest of lane context and every submodel's context."""
        return min([self.kv.lane_context, *(s.context for s in self.submodels)])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _plain(asdict(self))
        for sub in out["submodels"]:
            if sub["prefill_at_offset"] is None:  # undeclared: a package without it does not have it
                del sub["prefill_at_offset"]
        if out["topology"]["d2d"] is None:  # undeclared: no cross-chip traffic modelled
            del out["topology"]["d2d"]
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PackageManifest:
        """Parse a manifest dict.

        Raises:
            ManifestError: a field is missing, of the wrong type, or the schema version is unknown.
        """
        return _parse_manifest(raw)


def load_manifest(package_dir: Path) -> PackageManifest:
    """Read and parse `package_dir/calculet-package.json`.

    Raises:
        ManifestError: missing file, invalid JSON or wrong structure.
    """
    return PackageManifest.from_dict(read_manifest_json(package_dir))


def read_manifest_json(package_dir: Path) -> dict[str, Any]:
    """Read `package_dir/calculet-package.json` as a JSON object, refusing what could hurt the reader.

    Refused before parsing: a path that is not a regular file (a FIFO is never opened), a file over
    `MAX_MANIFEST_BYTES`; while parsing: non-UTF-8 bytes, invalid JSON, integers Python will not
    convert (over 4,300 digits), nesting past the parser's recursion; after: nesting deeper than
    `MAX_MANIFEST_DEPTH`, strings holding lone UTF-16 surrogates (not Unicode text, unencodable
    on the wire). NaN/Infinity are parsed; the structural check reports them per field.

    Raises:
        ManifestError: with `code` manifest.missing, manifest.not_regular, manifest.too_large,
            manifest.too_deep, file.symlink_loop or manifest.unreadable.
    """
    path = Path(package_dir) / MANIFEST_NAME
    try:
        data = read_regular(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise ManifestError(f"{MANIFEST_NAME} not found in {package_dir}", "manifest.missing") from None
    except NotRegularFile as exc:
        raise ManifestError(f"{MANIFEST_NAME} is {exc.kind}, not a regular file", "manifest.not_regular") from None
    except FileTooLarge as exc:
        raise ManifestError(
            f"{MANIFEST_NAME} is over the {exc.limit:,} B limit ({exc.size:,} B); not parsed",
            "manifest.too_large",
        ) from None
    except OSError as exc:
        code = "file.symlink_loop" if exc.errno == errno.ELOOP else "manifest.unreadable"
        raise ManifestError(f"cannot read {MANIFEST_NAME}: {exc.strerror or exc}", code) from None
    return _parse_json(data)


def _parse_json(data: bytes) -> dict[str, Any]:
    """Raises: ManifestError (manifest.unreadable or manifest.too_deep)."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{MANIFEST_NAME} is not UTF-8: {exc}", "manifest.unreadable") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"not valid JSON: {exc.msg} at line {exc.lineno}", "manifest.unreadable") from None
    except RecursionError:  # the C decoder recurses once per level: no depth cap can run before it
        raise ManifestError(f"JSON nested deeper than {MAX_MANIFEST_DEPTH} levels", "manifest.too_deep") from None
    except ValueError as exc:  # e.g. an integer literal longer than sys.get_int_max_str_digits()
        raise ManifestError(f"not readable JSON: {exc}", "manifest.unreadable") from None
    if not isinstance(raw, dict):
        raise ManifestError("the top level must be a JSON object", "manifest.unreadable")
    _check_tree(raw)
    return raw


def _check_tree(raw: dict[str, Any]) -> None:
    """Walk the parsed JSON with an explicit stack (never recursion).

    Raises:
        ManifestError: nesting deeper than MAX_MANIFEST_DEPTH (manifest.too_deep), or a key or
            string that is not Unicode text (manifest.unreadable).
    """
    pending: list[tuple[dict[str, Any] | list[Any], int]] = [(raw, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_MANIFEST_DEPTH:
            raise ManifestError(f"JSON nested deeper than {MAX_MANIFEST_DEPTH} levels", "manifest.too_deep")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            for text in (key, value):
                if isinstance(text, str) and not text.isascii():
                    _unicode_text(text)
            if isinstance(value, dict | list):
                pending.append((value, depth + 1))


def _unicode_text(text: str) -> None:
    """Raises: ManifestError when `text` holds a lone surrogate (JSON `\\ud800` escapes decode to one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end].encode("unicode_escape").decode("ascii")
        raise ManifestError(f"a string holds {bad}, a lone UTF-16 surrogate, not text", "manifest.unreadable") from None


def write_manifest(package_dir: Path, manifest: PackageManifest) -> Path:
    path = Path(package_dir) / MANIFEST_NAME
    path.write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- parsing helpers


def _plain(value: Any) -> Any:
    """Tuples -> lists recursively, so the dict is exactly what JSON holds."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class _Reader:
    """Typed field access with error messages naming the JSON path."""

    def __init__(self, raw: Any, where: str) -> None:
        if not isinstance(raw, Mapping):
            raise ManifestError(f"{where}: expected an object")
        self.raw = raw
        self.where = where

    def _get(self, key: str, default: Any = ...) -> Any:
        if key not in self.raw:
            if default is ...:
                raise ManifestError(f"{self.where}.{key}: missing")
            return default
        return self.raw[key]

    def int_(self, key: str, default: Any = ...) -> Any:
        v = self._get(key, default)
        if v is default and default is not ...:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise ManifestError(f"{self.where}.{key}: expected an integer, got {v!r:.40}")
        _int64(v, f"{self.where}.{key}")
        return v

    def float_(self, key: str, default: Any = ...) -> float:
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ManifestError(f"{self.where}.{key}: expected a number, got {v!r:.40}")
        return _finite(v, f"{self.where}.{key}")

    def bool_(self, key: str, default: Any = ...) -> bool:
        v = self._get(key, default)
        if not isinstance(v, bool):
            raise ManifestError(f"{self.where}.{key}: expected true or false, got {v!r:.40}")
        return v

    def str_(self, key: str, default: Any = ...) -> str:
        v = self._get(key, default)
        if not isinstance(v, str):
            raise ManifestError(f"{self.where}.{key}: expected a string, got {v!r}")
        return v

    def list_(self, key: str, default: Any = ...) -> list[Any]:
        v = self._get(key, default)
        if not isinstance(v, list):
            raise ManifestError(f"{self.where}.{key}: expected a list, got {type(v).__name__}")
        return v

    def ints(self, key: str, default: Any = ...) -> tuple[int, ...]:
        items = self.list_(key, default)
        for i, v in enumerate(items):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ManifestError(f"{self.where}.{key}[{i}]: expected an integer, got {v!r:.40}")
            _int64(v, f"{self.where}.{key}[{i}]")
        return tuple(items)

    def strmap(self, key: str) -> dict[str, str]:
        v = self._get(key, {})
        if not isinstance(v, Mapping) or not all(isinstance(x, str) for x in v.values()):
            raise ManifestError(f"{self.where}.{key}: expected an object of strings")
        return dict(v)

    def sub(self, key: str) -> _Reader:
        return _Reader(self._get(key), f"{self.where}.{key}")

    def subs(self, key: str, default: Any = ...) -> list[_Reader]:
        return [_Reader(v, f"{self.where}.{key}[{i}]") for i, v in enumerate(self.list_(key, default))]


def _int64(value: int, where: str) -> None:
    """Raises: ManifestError when `value` does not fit in 64 bits."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ManifestError(f"{where}: an integer of {len(str(abs(value)))} digits does not fit in 64 bits")


def _finite(value: float, where: str) -> float:
    """`value` as a finite float.

    Raises:
        ManifestError: NaN or infinite (JSON has neither; Python's parser reads them).
    """
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ManifestError(f"{where}: expected a finite number, got {number}")
    return number


def _tensor(r: _Reader) -> TensorDecl:
    return TensorDecl(r.str_("name"), r.ints("shape"), r.str_("dtype"), r.str_("layout", "row-major"))


def _architecture(a: _Reader) -> Architecture:
    return Architecture(
        a.str_("family"), a.int_("layers"), a.int_("hidden_size"), a.int_("q_heads"), a.int_("kv_heads"),
        a.int_("head_dim"), a.int_("experts"), a.int_("experts_per_token"), a.int_("expert_intermediate"),
        a.int_("vocab_size"), a.float_("rope_theta"), a.float_("rms_norm_eps"),
        a.int_("intermediate_size", 0), a.bool_("tied_embeddings", False),
    )  # fmt: skip


def _kv(k: _Reader) -> KVDecl:
    return KVDecl(
        k.str_("dtype"), k.str_("layout"), k.int_("lanes"), k.int_("lane_context"),
        k.int_("bytes_per_token"), k.str_("split"),
    )  # fmt: skip


def _submodel(s: _Reader) -> SubmodelDecl:
    return SubmodelDecl(
        s.str_("name"), s.str_("role"), s.str_("smodel_type"), s.int_("batch"), s.int_("max_tokens"),
        s.int_("context"), s.str_("folder"), tuple(_tensor(x) for x in s.subs("inputs")),
        tuple(_tensor(x) for x in s.subs("outputs")), s.strmap("csr"),
        s.bool_("prefill_at_offset") if "prefill_at_offset" in s.raw else None,
    )  # fmt: skip


def _topology(t: _Reader) -> Topology:
    d2d = None
    if "d2d" in t.raw:
        d = t.sub("d2d")
        d2d = D2DDecl(
            d.int_("bytes_per_token"), d.int_("syncs_per_job", 0), d.float_("link_gbps", DEFAULT_D2D_LINK_GBPS),
            d.float_("sync_us", DEFAULT_D2D_SYNC_US),
        )  # fmt: skip
    return Topology(t.int_("chips"), t.ints("chip_masks"), t.str_("parallelism"), d2d)


def _memory(m: _Reader) -> MemoryDecl:
    chips = tuple(_chip_memory(c) for c in m.subs("chips"))
    return MemoryDecl(chips, m.int_("device_memory_required_bytes"))


def _chip_memory(c: _Reader) -> ChipMemoryDecl:
    return ChipMemoryDecl(
        c.int_("chip"), c.int_("chip_mask"), c.int_("param_dram_bytes"), c.int_("param_sram_bytes"),
        c.int_("workspace_bytes"),
    )  # fmt: skip


def _compat_row(r: _Reader) -> CompatRow:
    return CompatRow(r.str_("runtime"), r.str_("driver"), r.str_("firmware"), r.bool_("co_resident", False))


def _file(f: _Reader) -> FileEntry:
    return FileEntry(f.str_("path"), f.int_("size"), f.str_("sha256"), f.str_("role"))


def _tokenizer(tk: _Reader) -> TokenizerDecl:
    return TokenizerDecl(
        tk.str_("path"), tk.str_("chat_template"), tk.int_("model_max_length"), tk.ints("eos_token_ids"),
        tk.int_("bos_token_id", None), tk.int_("pad_token_id", None),
    )  # fmt: skip


def _golden(g: _Reader) -> GoldenDecl:
    top: list[tuple[int, float]] = []
    for i, pair in enumerate(g.list_("prefill_top")):
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], int)
            and not isinstance(pair[0], bool)
            and isinstance(pair[1], int | float)
            and not isinstance(pair[1], bool)
        ):
            raise ManifestError(f"manifest.golden.prefill_top[{i}]: expected [token, logit]")
        _int64(pair[0], f"manifest.golden.prefill_top[{i}][0]")
        top.append((pair[0], _finite(pair[1], f"manifest.golden.prefill_top[{i}][1]")))
    return GoldenDecl(g.ints("prompt_tokens"), tuple(top), g.ints("decode_tokens"), g.float_("logit_atol"))


def _timing(tm: _Reader) -> TimingDecl:
    """Raises: ManifestError (`timing.legacy_line`) for the retired linear form, else as `_Reader`."""
    if "decode_curve" not in tm.raw and any(name in tm.raw for name in LEGACY_TIMING_FIELDS):
        raise ManifestError(f"{tm.where}: {LEGACY_TIMING_MESSAGE}", "timing.legacy_line")
    curve = tuple(DecodePoint(p.int_("context"), p.float_("ms_per_token")) for p in tm.subs("decode_curve"))
    return TimingDecl(
        curve, tm.float_("prefill_fixed_ms"), tm.float_("prefill_ms_per_token"), tm.float_("batch_alpha"),
        tm.float_("h2d_gbps"), tm.float_("d2h_gbps"), tm.strmap("sources"),
    )  # fmt: skip


def _parse_manifest(raw: Mapping[str, Any]) -> PackageManifest:
    r = _Reader(raw, "manifest")
    version = r.int_("schema_version")
    if version != SCHEMA_VERSION:
        raise ManifestError(f"manifest.schema_version: {version} is not supported (this build reads {SCHEMA_VERSION})")
    c = r.sub("compatibility")
    return PackageManifest(
        schema_version=version,
        name=r.str_("name"),
        model_role=r.str_("model_role"),
        kernel=r.str_("kernel"),
        architecture=_architecture(r.sub("architecture")),
        quantization=r.str_("quantization"),
        topology=_topology(r.sub("topology")),
        kv=_kv(r.sub("kv")),
        submodels=tuple(_submodel(s) for s in r.subs("submodels")),
        memory=_memory(r.sub("memory")),
        compatibility=Compatibility(
            c.str_("runtime"),
            c.str_("driver"),
            c.strmap("compiler"),
            tuple(_compat_row(x) for x in c.subs("matrix", [])),
        ),
        files=tuple(_file(f) for f in r.subs("files")),
        tokenizer=_tokenizer(r.sub("tokenizer")),
        golden=_golden(r.sub("golden")),
        timing=_timing(r.sub("timing")),
        synthetic_seed=r.int_("synthetic_seed", 0),
        logits_output=_logits_output(r),
    )


def _logits_output(r: _Reader) -> LogitsOutput:
    """`logits_output` (absent: full logits)."""
    if "logits_output" not in r.raw:
        return LogitsOutput()
    o = r.sub("logits_output")
    return LogitsOutput(o.str_("mode"), o.int_("k", 0))
