"""Semantic checks of a parsed manifest that do not depend on the board.

This module owns the consistency of a package with itself: value ranges, architecture,
kernel, submodel names/roles/labels/tensors, contexts, KV layout and bytes per token, chip
topology against the per-chip memory entries, tokenizer and golden data, and the timing
model's decode curve (`decode_curve_problems`, shared with calsim's configure check). `ModelRules.run`
reads a `PackageManifest` and appends findings to the caller's `Findings`; it never raises
for a package defect. Board-dependent checks (memory, capacity, compatibility) are in
`rules_device`.
"""

from __future__ import annotations

import itertools
import math
import posixpath
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import jinja2
import jinja2.sandbox

from calculet.daemon.package.capacity import KV_DTYPE_BYTES, KV_SPLITS, kv_bytes_per_token
from calculet.daemon.package.files import resolve_inside
from calculet.daemon.package.fs import FileRefused, FileTooLarge, read_regular
from calculet.daemon.package.logits_output import MODES, output_tensors
from calculet.daemon.package.manifest import (
    DTYPES,
    LEGACY_PARALLELISM,
    MAX_DECODE_CURVE_POINTS,
    PARALLELISMS,
    SINGLE_CHIP,
    SUBMODEL_ROLES,
    Architecture,
    DecodePoint,
    PackageManifest,
    SubmodelDecl,
)
from calculet.daemon.package.report import Findings

# Vendor `smodel_type` labels (docs/sources.md 003 §3) and the role each one means.
VENDOR_LABELS = {"llm_prefill": "prefill", "llm_decode": "decode"}
MAX_TEMPLATE_BYTES = 1 << 20  # a chat template file larger than this is refused, not parsed
MAX_CHIPS = 64  # chip masks are bit masks; also keeps `1 << chip` small for absurd inputs
# File codes after which a listed file is not read again (its problem is already reported).
_UNREADABLE = frozenset(
    {"file.missing", "file.not_regular", "file.unreadable", "file.symlink_loop", "file.path_escape"}
)


class ModelRules:
    """Checks one manifest against itself.

    Args:
        manifest: the parsed manifest.
        findings: collector owned by the caller.
        root: the resolved package directory, to read a chat template given as a listed file
            (None: such a template is not read).
    """

    def __init__(self, manifest: PackageManifest, findings: Findings, root: Path | None = None) -> None:
        self.m = manifest
        self.f = findings
        self.root = root

    def run(self) -> None:
        self.ranges()
        self.architecture()
        if not self.m.kernel:
            self.f.add("kernel.unknown", "manifest.kernel", "the package names no kernel kind")
        self.submodel_roles()
        self.logits_output()
        for i, s in enumerate(self.m.submodels):
            self.tensors(i, s)
        self.contexts()
        self.kv()
        self.topology()
        self.tokenizer()
        self.golden()
        self.timing()

    # ------------------------------------------------------------ ranges

    def _positive(self, where: str, value: float, strict: bool = True) -> None:
        ok = value > 0 if strict else value >= 0  # written so that NaN fails
        if not ok:
            need = "positive" if strict else "non-negative"
            self.f.add("value.range", where, f"must be {need}, got {value}")

    def ranges(self) -> None:
        m = self.m
        self._positive("manifest.kv.lanes", m.kv.lanes)
        self._positive("manifest.kv.lane_context", m.kv.lane_context)
        self._positive("manifest.kv.bytes_per_token", m.kv.bytes_per_token)
        self._positive("manifest.topology.chips", m.topology.chips)
        self._positive("manifest.tokenizer.model_max_length", m.tokenizer.model_max_length)
        self._positive("manifest.golden.logit_atol", m.golden.logit_atol, strict=False)
        for i, s in enumerate(m.submodels):
            for name in ("batch", "max_tokens", "context"):
                self._positive(f"manifest.submodels[{i}].{name}", getattr(s, name))
        t = m.timing
        for name in ("h2d_gbps", "d2h_gbps"):
            self._positive(f"manifest.timing.{name}", getattr(t, name))
        for name in ("prefill_fixed_ms", "prefill_ms_per_token", "batch_alpha"):
            self._positive(f"manifest.timing.{name}", getattr(t, name), strict=False)

    def architecture(self) -> None:
        a = self.m.architecture
        where = "manifest.architecture"
        for name in ("layers", "hidden_size", "q_heads", "kv_heads", "head_dim", "vocab_size"):
            if getattr(a, name) <= 0:
                self.f.add("arch.invalid", f"{where}.{name}", f"must be positive, got {getattr(a, name)}")
        if a.dense:
            self._dense_ffn(a, where)
        else:
            self._experts(a, where)
        if not (a.rope_theta > 0 and a.rms_norm_eps > 0):  # NaN fails too
            self.f.add("arch.invalid", where, "rope_theta and rms_norm_eps must be positive")
        if a.q_heads > 0 and a.kv_heads > 0 and a.q_heads % a.kv_heads:
            self.f.add(
                "arch.invalid",
                f"{where}.kv_heads",
                f"{a.q_heads} Q heads do not group over {a.kv_heads} KV heads",
            )

    def _experts(self, a: Architecture, where: str) -> None:
        """A mixture-of-experts model: positive experts, active experts and expert width."""
        for name in ("experts", "experts_per_token", "expert_intermediate"):
            if getattr(a, name) <= 0:
                self.f.add("arch.invalid", f"{where}.{name}", f"must be positive, got {getattr(a, name)}")
        if a.intermediate_size < 0:
            self.f.add("arch.invalid", f"{where}.intermediate_size", f"must not be negative, got {a.intermediate_size}")
        if a.experts_per_token > a.experts:
            self.f.add(
                "arch.invalid",
                f"{where}.experts_per_token",
                f"{a.experts_per_token} active of {a.experts} experts",
            )

    def _dense_ffn(self, a: Architecture, where: str) -> None:
        """A dense model (`experts` 0): one FFN of `intermediate_size`, no expert fields."""
        if a.intermediate_size <= 0:
            self.f.add(
                "arch.invalid",
                f"{where}.intermediate_size",
                f"a dense model (experts 0) needs its FFN width, got {a.intermediate_size}",
            )
        for name in ("experts_per_token", "expert_intermediate"):
            if getattr(a, name) != 0:
                self.f.add(
                    "arch.invalid", f"{where}.{name}", f"a dense model (experts 0) has none, got {getattr(a, name)}"
                )

    # ------------------------------------------------------------ submodels

    def submodel_roles(self) -> None:
        subs = self.m.submodels
        for name, n in Counter(s.name for s in subs).items():
            if n > 1:
                self.f.add("submodel.duplicate_name", "manifest.submodels", f"{n} submodels are named {name!r}")
        for i, s in enumerate(subs):
            where = f"manifest.submodels[{i}]"
            if s.role not in SUBMODEL_ROLES:
                self.f.add(
                    "submodel.role_unknown",
                    f"{where}.role",
                    f"{s.name}: role {s.role!r} is not prefill or decode",
                )
                continue
            label_role = VENDOR_LABELS.get(s.smodel_type)
            if label_role is None:
                self.f.add(
                    "submodel.smodel_type_unknown",
                    f"{where}.smodel_type",
                    f"{s.name}: vendor label {s.smodel_type!r} is not one of {', '.join(VENDOR_LABELS)}",
                )
            elif label_role != s.role:
                self._mislabel(where, s, label_role)
            if s.prefill_at_offset is not None and s.role != "prefill":
                self.f.add(
                    "submodel.offset_role",
                    f"{where}.prefill_at_offset",
                    f"{s.name}: a {s.role} submodel declares prefill_at_offset, which only a prefill has",
                )
        for role in SUBMODEL_ROLES:
            if not any(s.role == role for s in subs):
                self.f.add("submodel.role_missing", "manifest.submodels", f"no {role} submodel")
        keys = Counter((s.role, s.batch, s.max_tokens) for s in subs if s.role in SUBMODEL_ROLES)
        for (role, batch, tokens), n in keys.items():
            if n > 1:
                names = ", ".join(s.name for s in subs if (s.role, s.batch, s.max_tokens) == (role, batch, tokens))
                self.f.add(
                    "submodel.ambiguous",
                    "manifest.submodels",
                    f"{n} {role} submodels with batch {batch} and {tokens} tokens: {names}",
                )

    def _mislabel(self, where: str, s: SubmodelDecl, label_role: str) -> None:
        """The vendor label names the other role. The daemon dispatches by `role`, never by the
        label; when the I/O says the same as `role` (a prefill feeds more than one token per row, a
        decode one), the submodel is what `role` says and the label is only reported, as for
        today's calbin whose prefill is labelled `llm_decode` (docs/sources.md 001 §9 P0.7, 003
        §12). When the I/O cannot tell, the package contradicts itself: refused."""
        io_role = "prefill" if s.max_tokens > 1 else "decode"
        if io_role == s.role:
            self.f.add(
                "submodel.label_ignored",
                f"{where}.smodel_type",
                f"{s.name}: the vendor labels it {s.smodel_type!r} ({label_role}), but it takes {s.max_tokens} "
                f"token(s) per row: a {s.role}, served as one (the label is ignored)",
            )
            return
        self.f.add(
            "submodel.mislabelled",
            f"{where}.smodel_type",
            f"{s.name}: role {s.role} but the vendor labels it {s.smodel_type!r} ({label_role}), and its "
            f"{s.max_tokens} token(s) per row do not settle which",
        )

    def logits_output(self) -> None:
        """`logits_output`: mode full (k 0) or topk with 1 <= k <= vocab (`package/logits_output.py`)."""
        out, vocab = self.m.logits_output, self.m.architecture.vocab_size
        if out.mode not in MODES:
            self.f.add(
                "logits.output", "manifest.logits_output.mode", f"must be one of {', '.join(MODES)}, got {out.mode!r}"
            )
        elif out.topk and not 1 <= out.k <= max(1, vocab):
            self.f.add("logits.output", "manifest.logits_output.k", f"topk needs 1 <= k <= vocab {vocab}, got {out.k}")
        elif not out.topk and out.k != 0:
            self.f.add("logits.output", "manifest.logits_output.k", f"full mode takes no k, got {out.k}")

    def _logits_output_valid(self) -> bool:
        out = self.m.logits_output
        if out.topk:
            return 1 <= out.k <= max(1, self.m.architecture.vocab_size)
        return out.mode in MODES and out.k == 0

    def tensors(self, i: int, s: SubmodelDecl) -> None:
        """tokens/positions int32 [batch, max_tokens] (decode: max_tokens 1); the outputs of the
        package's logits output mode (`logits_output.output_tensors`: logits bf16 [batch, vocab])."""
        where = f"manifest.submodels[{i}]"
        if s.role == "decode" and s.max_tokens != 1:
            self.f.add(
                "submodel.shape",
                f"{where}.max_tokens",
                f"{s.name}: decode feeds 1 token per row, not {s.max_tokens}",
            )
        vocab = self.m.architecture.vocab_size
        want = {
            "inputs": {
                "tokens": ([s.batch, s.max_tokens], "int32"),
                "positions": ([s.batch, s.max_tokens], "int32"),
            },
            "outputs": {
                name: (list(shape), dtype)
                for name, (shape, dtype) in output_tensors(s.role, s.batch, vocab, self.m.logits_output).items()
            },
        }
        if not self._logits_output_valid():
            del want["outputs"]  # `logits.output` says what is wrong; the outputs cannot be judged
        for side, expected in want.items():
            decls = s.inputs if side == "inputs" else s.outputs
            names = Counter(t.name for t in decls)
            for j, t in enumerate(decls):
                tw = f"{where}.{side}[{j}]"
                if t.dtype not in DTYPES:
                    self.f.add("submodel.dtype", tw, f"{s.name}.{t.name}: unknown dtype {t.dtype!r}")
                if t.name not in expected:
                    continue
                shape, dtype = expected[t.name]
                if list(t.shape) != shape and not (t.name == "logits" and vocab <= 0):
                    self.f.add(
                        "submodel.shape",
                        tw,
                        f"{s.name}.{t.name}: shape {list(t.shape)} but a {s.role} submodel"
                        f" with batch {s.batch} needs {shape}",
                    )
                if t.dtype in DTYPES and t.dtype != dtype:
                    self.f.add("submodel.dtype", tw, f"{s.name}.{t.name}: dtype {t.dtype} but must be {dtype}")
            for name in expected:
                if names[name] != 1:
                    state = "missing" if names[name] == 0 else f"declared {names[name]} times"
                    self.f.add("submodel.io", f"{where}.{side}", f"{s.name}: {side[:-1]} {name!r} is {state}")

    # ------------------------------------------------------------ contexts and KV

    def contexts(self) -> None:
        subs = [s for s in self.m.submodels if s.context > 0]
        for i, s in enumerate(self.m.submodels):
            if s.role == "prefill" and 0 < s.context < s.max_tokens:
                self.f.add(
                    "context.bucket",
                    f"manifest.submodels[{i}].max_tokens",
                    f"{s.name}: bucket of {s.max_tokens:,} tokens exceeds its context {s.context:,}",
                )
        if not subs:
            return
        calbin = min(s.context for s in subs)
        if len({s.context for s in subs}) > 1:
            listing = ", ".join(f"{s.name}={s.context:,}" for s in subs)
            self.f.add("context.mismatch", "manifest.submodels", f"contexts differ ({listing}); {calbin:,} applies")
        if self.m.kv.lane_context > calbin:
            self.f.add(
                "context.lane",
                "manifest.kv.lane_context",
                f"lane context {self.m.kv.lane_context:,} exceeds the calbin context {calbin:,}",
            )

    def kv(self) -> None:
        kv, a = self.m.kv, self.m.architecture
        if kv.dtype not in KV_DTYPE_BYTES:
            self.f.add("kv.dtype", "manifest.kv.dtype", f"{kv.dtype!r} is not one of {', '.join(KV_DTYPE_BYTES)}")
        if kv.split not in KV_SPLITS:
            self.f.add("kv.split", "manifest.kv.split", f"{kv.split!r} is not one of {', '.join(KV_SPLITS)}")
        elif kv.split == "kv_heads" and self.m.topology.chips > 0 and a.kv_heads % self.m.topology.chips:
            self.f.add(
                "kv.split",
                "manifest.kv.split",
                f"{a.kv_heads} KV heads do not divide over {self.m.topology.chips} chips",
            )
        arch_ok = all(v > 0 for v in (a.layers, a.kv_heads, a.head_dim))
        if kv.dtype in KV_DTYPE_BYTES and arch_ok:
            want = kv_bytes_per_token(a, kv.dtype)
            if kv.bytes_per_token != want:
                self.f.add(
                    "kv.bytes_per_token",
                    "manifest.kv.bytes_per_token",
                    f"{kv.bytes_per_token:,} B but {a.layers} layers x {a.kv_heads} KV heads x 2"
                    f" x {a.head_dim} x {KV_DTYPE_BYTES[kv.dtype]} B ({kv.dtype}) = {want:,} B",
                )
        batches = [s.batch for s in self.m.submodels if s.role == "decode"]
        if batches and kv.lanes > 0 and max(batches) > kv.lanes:
            self.f.add(
                "kv.lanes_below_batch",
                "manifest.kv.lanes",
                f"decode batch {max(batches)} needs {max(batches)} lanes, the KV declares {kv.lanes}",
            )

    def topology(self) -> None:
        t, mem = self.m.topology, self.m.memory.chips
        where = "manifest.topology"
        if len(t.chip_masks) != t.chips:
            self.f.add("topology.mismatch", f"{where}.chip_masks", f"{len(t.chip_masks)} masks for {t.chips} chips")
        bad = [mk for mk in t.chip_masks if mk <= 0 or mk & (mk - 1)]
        if bad or len(set(t.chip_masks)) != len(t.chip_masks):
            self.f.add(
                "topology.mismatch",
                f"{where}.chip_masks",
                f"masks {list(t.chip_masks)} are not distinct single bits",
            )
        if len(mem) != t.chips:
            self.f.add(
                "topology.mismatch",
                "manifest.memory.chips",
                f"{len(mem)} per-chip entries for {t.chips} chips",
            )
        for i, c in enumerate(mem):
            if not 0 <= c.chip < MAX_CHIPS or c.chip_mask != 1 << c.chip:
                self.f.add(
                    "topology.mismatch",
                    f"manifest.memory.chips[{i}]",
                    f"chip {c.chip} has mask {c.chip_mask:#x}; chip N's mask is 1 << N",
                )
        masks = {c.chip_mask for c in mem}
        if len(masks) != len(mem) or masks != set(t.chip_masks):
            self.f.add(
                "topology.mismatch",
                "manifest.memory.chips",
                f"per-chip masks {sorted(masks)} differ from topology masks {sorted(t.chip_masks)} or repeat",
            )
        self.parallelism()
        self.d2d()

    def parallelism(self) -> None:
        """A form docs/sources.md 000 §11 names (`tp`, `ep`, `pp`, `tp+ep`) on several chips, `none` on one."""
        t, where = self.m.topology, "manifest.topology.parallelism"
        form = LEGACY_PARALLELISM.get(t.parallelism, t.parallelism)
        if form != t.parallelism:
            self.f.add("topology.parallelism_legacy", where, f"{t.parallelism!r} is read as {form!r}; rebuild")
        if form not in (*PARALLELISMS, SINGLE_CHIP):
            known = ", ".join(repr(p) for p in (*PARALLELISMS, SINGLE_CHIP))
            self.f.add("topology.parallelism", where, f"{t.parallelism!r} is not a known form ({known})")
        elif (form == SINGLE_CHIP) != (t.chips == 1):
            need = f"'{SINGLE_CHIP}'" if t.chips == 1 else f"one of {', '.join(PARALLELISMS)}"
            self.f.add("topology.parallelism", where, f"{t.parallelism!r} on {t.chips} chip(s); expected {need}")

    def d2d(self) -> None:
        """Cross-chip traffic: only between chips, every figure in range."""
        t, where = self.m.topology, "manifest.topology.d2d"
        if t.d2d is None:
            return
        if t.chips == 1:
            self.f.add("topology.d2d", where, "a package on one chip has no cross-chip traffic to declare")
        self._positive(f"{where}.bytes_per_token", t.d2d.bytes_per_token, strict=False)
        self._positive(f"{where}.syncs_per_job", t.d2d.syncs_per_job, strict=False)
        self._positive(f"{where}.link_gbps", t.d2d.link_gbps)
        self._positive(f"{where}.sync_us", t.d2d.sync_us, strict=False)

    # ------------------------------------------------------------ tokenizer and golden

    def _token_ids(self, code: str, where: str, ids: list[int]) -> None:
        vocab = self.m.architecture.vocab_size
        bad = [t for t in ids if t < 0 or t >= vocab]
        if bad and vocab > 0:
            self.f.add(code, where, f"token ids {bad[:5]} are outside the vocab [0, {vocab})")

    def tokenizer(self) -> None:
        tk, m = self.m.tokenizer, self.m
        where = "manifest.tokenizer"
        if m.context > 0 and tk.model_max_length > m.context:
            self.f.add(
                "tokenizer.max_length_clamped",
                f"{where}.model_max_length",
                f"model_max_length {tk.model_max_length:,} exceeds the package context {m.context:,};"
                f" clamped to {m.context}",
            )
        if not tk.eos_token_ids:
            self.f.add(
                "tokenizer.eos_missing",
                f"{where}.eos_token_ids",
                "no EOS token id; generation could not stop",
            )
        self._token_ids("tokenizer.token_range", f"{where}.eos_token_ids", list(tk.eos_token_ids))
        for name in ("bos_token_id", "pad_token_id"):
            value = getattr(tk, name)
            if value is not None:
                self._token_ids("tokenizer.token_range", f"{where}.{name}", [value])
        listed = {posixpath.normpath(e.path) for e in m.files if e.path}
        if not tk.path or posixpath.normpath(tk.path) not in listed:
            self.f.add("tokenizer.path", f"{where}.path", f"{tk.path!r} is not one of the manifest's files")
        template = self._chat_template_text(listed)
        if template is None:
            return
        try:
            # Parse as Hugging Face renders chat templates: sandboxed, with loop controls.
            jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
        except jinja2.TemplateSyntaxError as exc:
            self.f.add("tokenizer.chat_template", f"{where}.chat_template", f"line {exc.lineno}: {exc.message}")
        except RecursionError:  # Jinja2's parser recurses once per nested block or bracket
            self.f.add("tokenizer.chat_template", f"{where}.chat_template", "nests too deeply to parse")

    def _chat_template_text(self, listed: set[str]) -> str | None:
        """`chat_template` is either the Jinja2 text or the path of a listed file holding it.

        Returns:
            The template text, or None when the file cannot be read: reported here unless the
            file checks already reported that file (one defect, one message).
        """
        value = self.m.tokenizer.chat_template
        norm = posixpath.normpath(value) if value else ""
        if norm not in listed:
            return value
        real = resolve_inside(self.root, norm) if self.root is not None else None
        if real is None or self._file_reported(norm):
            return None
        where = "manifest.tokenizer.chat_template"
        try:
            return read_regular(real, MAX_TEMPLATE_BYTES).decode("utf-8")
        except FileTooLarge:
            self.f.add("tokenizer.chat_template", where, f"{norm} is over 1 MiB")
        except UnicodeDecodeError as exc:
            self.f.add("tokenizer.chat_template", where, f"{norm} is not UTF-8: {exc}")
        except (FileRefused, OSError) as exc:
            self.f.add("tokenizer.chat_template", where, f"{norm} cannot be read: {_reason(exc)}")
        return None

    def _file_reported(self, norm: str) -> bool:
        """Whether the file checks already reported the file entry `norm` as unreadable."""
        wheres = {
            f"manifest.files[{i}]" for i, e in enumerate(self.m.files) if posixpath.normpath(e.path or ".") == norm
        }
        return any(p.where in wheres and p.code in _UNREADABLE for p in self.f.problems)

    def golden(self) -> None:
        g, m = self.m.golden, self.m
        where = "manifest.golden"
        self._token_ids("golden.token_range", f"{where}.prompt_tokens", list(g.prompt_tokens))
        self._token_ids("golden.token_range", f"{where}.prefill_top", [t for t, _ in g.prefill_top])
        self._token_ids("golden.token_range", f"{where}.decode_tokens", list(g.decode_tokens))
        buckets = [s.max_tokens for s in m.submodels if s.role == "prefill"]
        if not g.prompt_tokens:
            self.f.add("golden.inconsistent", f"{where}.prompt_tokens", "empty golden prompt")
        elif buckets and len(g.prompt_tokens) > max(buckets):
            self.f.add(
                "golden.inconsistent",
                f"{where}.prompt_tokens",
                f"{len(g.prompt_tokens)} prompt tokens exceed the largest prefill bucket {max(buckets)}",
            )
        if m.context > 0 and len(g.prompt_tokens) + len(g.decode_tokens) > m.context:
            self.f.add("golden.inconsistent", where, f"prompt + decode tokens exceed the context {m.context:,}")
        logits = [v for _, v in g.prefill_top]
        if logits != sorted(logits, reverse=True):
            self.f.add("golden.inconsistent", f"{where}.prefill_top", "top logits are not in descending order")
        if not g.decode_tokens:
            self.f.add("golden.inconsistent", f"{where}.decode_tokens", "no golden decode tokens")
        elif logits:
            best = {t for t, v in g.prefill_top if v == max(logits)}
            if g.decode_tokens[0] not in best:
                self.f.add(
                    "golden.inconsistent",
                    f"{where}.decode_tokens",
                    f"first greedy token {g.decode_tokens[0]} is not the top prefill logit's token {sorted(best)}",
                )

    # ------------------------------------------------------------ timing

    def timing(self) -> None:
        """The decode curve (`decode_curve_problems`); the other timing figures are in `ranges`."""
        for code, where, message in decode_curve_problems(self.m.timing.decode_curve, self.m.context):
            self.f.add(code, f"manifest.timing.{where}", message)


def _listing(items: list[str], limit: int = 3) -> str:
    return "; ".join(items[:limit]) + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def decode_curve_problems(curve: Sequence[DecodePoint], context: int) -> list[tuple[str, str, str]]:
    """Every defect of a decode curve, as `(code, where below "timing.", message)`.

    A usable curve has 2..MAX_DECODE_CURVE_POINTS points (`timing.curve_points`), contexts >= 0 and
    finite ms > 0 (`value.range`), contexts strictly increasing in the order given
    (`timing.curve_order`; this also rejects unsorted and repeated points), ms non-decreasing
    with context (`timing.curve_monotonic`: decode never gets faster as the KV grows), and a last
    point at or beyond `context`, the package context (`timing.curve_coverage`: calsim never reads
    the flat part above it). Checks that would restate an earlier defect are skipped: no
    monotonicity over unordered contexts. calsim's configure check runs the same function.

    Args:
        curve: the points as declared.
        context: tokens a sequence may hold (`PackageManifest.context`); <= 0 skips the coverage check.
    """
    out: list[tuple[str, str, str]] = []
    if not 2 <= len(curve) <= MAX_DECODE_CURVE_POINTS:
        out.append(
            ("timing.curve_points", "decode_curve", f"{len(curve)} point(s); a curve has 2..{MAX_DECODE_CURVE_POINTS}")
        )
    for i, p in enumerate(curve):
        if not p.context >= 0:
            out.append(("value.range", f"decode_curve[{i}].context", f"must be non-negative, got {p.context}"))
        if not (math.isfinite(p.ms_per_token) and p.ms_per_token > 0):  # written so that NaN fails
            out.append(
                ("value.range", f"decode_curve[{i}].ms_per_token", f"must be finite and positive, got {p.ms_per_token}")
            )
    pairs = list(enumerate(itertools.pairwise(curve), start=1))
    unordered = [f"point {i} at {b.context:,} follows {a.context:,}" for i, (a, b) in pairs if b.context <= a.context]
    if unordered:
        out.append(("timing.curve_order", "decode_curve", f"contexts must strictly increase: {_listing(unordered)}"))
    else:
        faster = [
            f"{a.ms_per_token} ms at {a.context:,} -> {b.ms_per_token} ms at {b.context:,}"
            for _, (a, b) in pairs
            if b.ms_per_token < a.ms_per_token
        ]
        if faster:
            out.append(
                (
                    "timing.curve_monotonic",
                    "decode_curve",
                    f"decode must not get faster with a longer context: {_listing(faster)}",
                )
            )
    if curve and context > 0 and max(p.context for p in curve) < context:
        out.append(
            (
                "timing.curve_coverage",
                "decode_curve",
                f"the curve ends at {max(p.context for p in curve):,} tokens but the package context is"
                f" {context:,}; its last point must reach the context",
            )
        )
    return out


def _reason(exc: Exception) -> str:
    """An exception as an operator reads it (the OS's words for an OSError)."""
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
