"""What a calsim package preset must say, as ABCs: geometry, params, compatibility, defaults.

A preset (`tiny.py`, `qwen.py`) owns everything that differs between packages; `build.py` owns
everything they share (tokenizer, submodels, stand-ins, capacity check, golden, manifest).
Data flow: build asks the preset for its tokenizer and chat template (default: the BPE trained at
build time and `chat_template.j2`), then for its `Architecture` (given the tokenizer's vocab),
then for its `ParamBlocks` (planned in memory, so the memory figures are known and checked
before anything is written), then tells the blocks to write themselves into the package.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from calculet.common.errors import InvalidArgument
from calculet.daemon.package.capacity import CALSIM_BOARD, DeviceLimits
from calculet.daemon.package.manifest import (
    Architecture,
    ChipMemoryDecl,
    Compatibility,
    CompatRow,
    TimingDecl,
    Topology,
)
from calculet.ops.sim_packages.chat_template import TEMPLATE_RESOURCE
from calculet.ops.sim_packages.submodels import PREFILL_LABEL, decode_name
from calculet.ops.sim_packages.timing import sim_timing
from calculet.ops.sim_packages.tokenizer import TrainedTokenizer, train_tokenizer
from calculet.ops.sim_packages.writer import PackageWriter

# Both presets emulate today's board: 2 chiplets, tensor parallel (docs/sources.md 001 §1, §6).
BOARD_TOPOLOGY = Topology(chips=2, chip_masks=(1, 2), parallelism="tp")

# What every calsim package declares it runs on: CalRT 0.7.6 with today's driver (one calbin at a
# time), and with the 1.0.0 driver, where it may share the board (docs/sources.md 000 §9, §17).
SIM_RUNTIME = ">=0.7.6,<0.8"
SIM_DRIVER = ">=0.7.6,<1.1"
SIM_MATRIX = (
    CompatRow(runtime=SIM_RUNTIME, driver=">=0.7.6,<1.0", firmware="*", co_resident=False),
    CompatRow(runtime=SIM_RUNTIME, driver=">=1.0.0,<1.1", firmware=">=1.0.0,<1.1", co_resident=True),
)


def sim_compatibility(compiler: dict[str, str]) -> Compatibility:
    """The compatibility section of a calsim package built by `compiler`."""
    return Compatibility(runtime=SIM_RUNTIME, driver=SIM_DRIVER, compiler=compiler, matrix=SIM_MATRIX)


class ParamBlocks(ABC):
    """The per-chip parameter blocks of one package, planned in memory before anything is written.

    Ownership: the blocks own their data (tensors or stand-in bytes) until `write` hands the
    files to the package writer; they are written once.
    """

    @property
    @abstractmethod
    def memory(self) -> tuple[ChipMemoryDecl, ...]:
        """Per-chip memory figures (params DRAM/SRAM and workspace), one entry per chip in chip order."""

    @property
    @abstractmethod
    def file_role(self) -> str:
        """The manifest role of the `param_blk*.bin` files."""

    @abstractmethod
    def write(self, writer: PackageWriter) -> None:
        """Write `param_blk{chip}.bin` for every chip of `memory` through `writer`, registered with
        `file_role`.

        Raises:
            OSError: the files cannot be written.
        """

    def moved_to(self, chips: tuple[ChipMemoryDecl, ...]) -> ParamBlocks:
        """The same blocks planned for other chips (`build-sim --chip`), one entry per entry of `memory`.

        Raises:
            InvalidArgument: these blocks cannot move (by default: none can).
        """
        raise InvalidArgument(f"{type(self).__name__}: parameter blocks that cannot move to another chip")


class SimPreset(ABC):
    """One `calctl package build-sim --preset` choice.

    Attributes:
        name: the `--preset` word.
        package_name: the manifest's `name`.
        kernel: calsim kernel ("numeric" or "synthetic").
        quantization: the manifest's quantization label.
        context: the emulated calbin's context (tokens a submodel accepts), the lane context cap.
        prefill_bucket: tokens per prefill job (the prefill submodel's input width).
        default_decode_batches: decode submodel batches when `--decode-batch` is not given.
        min_lanes: default lanes = max(min_lanes, largest decode batch).
        model_max_length: the value written into `tokenizer_config.json`.
        seed: weights seed (numeric) / `synthetic_seed` (synthetic).
        topology: chips, masks, parallelism.
        device: the board the default lane context is sized for and the fit is checked against.
        chat_template_resource: the chat template shipped, a file beside `chat_template.py`.
        prefill_label: the prefill submodel's vendor `smodel_type`.
        prefill_at_offset: what the prefill declares about a non-zero `past_kv_len` (None: nothing).
        only_decode_batches / max_lanes: a preset reproducing one compiled calbin allows only its
            decode batches and at most its lanes (None: any the build accepts).
    """

    name: str
    package_name: str
    kernel: str
    quantization: str
    context: int
    prefill_bucket: int
    default_decode_batches: tuple[int, ...]
    min_lanes: int
    model_max_length: int
    seed: int
    topology: Topology = BOARD_TOPOLOGY
    # The board packages are planned for: calsim's default (2 chips x 16 GiB DRAM, 18 MiB SRAM).
    device: DeviceLimits = CALSIM_BOARD
    chat_template_resource: str = TEMPLATE_RESOURCE
    prefill_label: str = PREFILL_LABEL
    # calsim's kernels run a prefill after any past_kv_len, so its packages say so (docs/package.md).
    prefill_at_offset: bool | None = True
    only_decode_batches: tuple[int, ...] | None = None
    max_lanes: int | None = None

    def decode_name(self, batch: int) -> str:
        """The decode submodel of `batch` rows: `decode_b{batch}`."""
        return decode_name(batch)

    def tokenizer(self) -> TrainedTokenizer:
        """The package's tokenizer; by default the small BPE trained at build time.

        Raises:
            FailedPrecondition: what the tokenizer is built from is missing or unusable.
        """
        return train_tokenizer()

    @abstractmethod
    def architecture(self, vocab_size: int) -> Architecture:
        """The model geometry.

        Args:
            vocab_size: the tokenizer's vocab rounded up to even (presets with a fixed real
                vocab ignore it).
        """

    @abstractmethod
    def params(self, arch: Architecture) -> ParamBlocks:
        """Plan the parameter blocks for `arch` (in memory; nothing is written yet)."""

    @abstractmethod
    def compatibility(self) -> Compatibility:
        """Runtime/driver ranges and the compiler that (nominally) produced the calbin."""

    def timing(self) -> TimingDecl:
        """The calsim timing table; by default the measured Qwen3-30B-A3B one (`timing.sim_timing`)."""
        return sim_timing()

    def default_lanes(self, decode_batches: Sequence[int]) -> int:
        """Enough lanes to fill the largest decode batch, at least `min_lanes`."""
        return max(self.min_lanes, *decode_batches)
