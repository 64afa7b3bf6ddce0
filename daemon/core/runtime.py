"""One model generation being served: the configured model and everything built for it.

A `ModelRuntime` is created by the ModelManager when a package is configured and lives until
that generation is unloaded. It bundles what the engine needs per generation: the device's
`ConfiguredModel`, the `KVManager` for its lanes, the `JobPool` of its host buffers, the
`Sampler`, the constraint compiler, the submodels chosen for prefill and decode, its prefill chunk
size, its jump-forward threshold (`jump.py`), whether it may prefill at an offset (chunks, prefix
reuse and jumps: `prefill_offset.py`, settled by the load's probe), its prefix reuse and jump
figures, and, on a device without lane selection, its fixed-slot rule and figures
(`compaction.py`). Nothing in it
outlives the generation; a completion carrying another generation never touches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from calculet.common.errors import FailedPrecondition
from calculet.common.lifecycle import Lifecycle
from calculet.daemon.core.chunking import CHUNK_AUTO, CHUNK_OFF, chunk_tokens
from calculet.daemon.core.compaction import SlotStats
from calculet.daemon.core.job_buffers import JobPool
from calculet.daemon.core.jump import JumpStats, jump_thresholds
from calculet.daemon.core.kv import KVManager
from calculet.daemon.core.model_state import MODEL_TRANSITIONS, ModelState
from calculet.daemon.core.prefill_offset import OffsetDecision
from calculet.daemon.core.request import ModelLimits
from calculet.daemon.device.api import ConfiguredModel, VirtualDevice
from calculet.daemon.device.slots import slot_bound
from calculet.daemon.device.types import EngineSlot, InactiveRows, SubmodelInfo, TaskType
from calculet.daemon.grammar import GrammarCompiler
from calculet.daemon.package.manifest import PackageManifest
from calculet.daemon.sampling.sampler import Sampler, SamplingPolicy


@dataclass
class PrefixStats:
    """Prefix reuse of one generation since it was configured (mutated under the engine lock).

    Attributes:
        hits / misses: new jobs that took a parked lane's prefix / that took a lane cold.
        hit_tokens / miss_tokens: their prompt (+ resumed) tokens served from KV / prefilled.
        evictions: parked lanes emptied for a job that found no FREE lane.
        dropped: parked lanes dropped after a reset or a fault.
    """

    hits: int = 0
    misses: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    evictions: int = 0
    dropped: int = 0


class ModelRuntime:
    """Everything one generation of one model alias needs.

    Args:
        alias: the model alias clients use.
        generation: unique, increasing per daemon.
        manifest / package_dir: the package it was configured from.
        lifecycle: its model state (the ModelManager moves it).
    """

    def __init__(
        self,
        alias: str,
        generation: int,
        manifest: PackageManifest,
        package_dir: Path,
        lifecycle: Lifecycle[ModelState] | None = None,
    ) -> None:
        self.alias = alias
        self.generation = generation
        self.manifest = manifest
        self.package_dir = package_dir
        self.lifecycle = lifecycle or Lifecycle(
            f"model {alias} gen {generation}", ModelState.UNLOADED, MODEL_TRANSITIONS
        )
        self.model: ConfiguredModel | None = None
        self.kv: KVManager | None = None
        self.pool: JobPool | None = None
        self.sampler: Sampler | None = None
        self.prefill: SubmodelInfo | None = None
        self.decodes: list[SubmodelInfo] = []
        self.eos_ids = frozenset(manifest.tokenizer.eos_token_ids)
        # Constraints compiled against this package's tokenizer (its tokenizer is built on first use).
        self.grammar = GrammarCompiler(
            package_dir / manifest.tokenizer.path,
            manifest.architecture.vocab_size,
            tuple(manifest.tokenizer.eos_token_ids),
        )
        self.message = ""
        self.ready_at: float | None = None  # unix time of publication
        self.drained_jobs = 0  # jobs that finished while it drained for unload
        self.interrupted_jobs = 0  # jobs the drain timeout cut off (ERROR + UNAVAILABLE)
        self.prefill_chunk = 0  # tokens one prefill job carries (set by `attach`)
        self.chunked = False  # prefills longer than `prefill_chunk` run as several jobs
        self.jump_min_runs: tuple[int, ...] = ()  # `jump.jump_thresholds` (empty: never jumps; set by `attach`)
        self.prefix_reuse = False  # its finished client jobs park lanes and new ones match them (`attach`)
        self.offset: OffsetDecision | None = None  # how it prefills at an offset (`settle_offset`)
        self.prefix = PrefixStats()
        self.jumps = JumpStats()
        # The device's inactive-row rule when it has no lane selection (row i is slot i), else None.
        self.fixed_slots: InactiveRows | None = None
        self.slots = SlotStats()

    @property
    def state(self) -> ModelState:
        return self.lifecycle.state

    def attach(
        self,
        device: VirtualDevice,
        model: ConfiguredModel,
        engine_slots: tuple[EngineSlot, ...],
        serial_sampling: bool = False,
        chunk_setting: int = CHUNK_AUTO,
        prefix_reuse: bool = True,
    ) -> None:
        """Build the per-generation state around a freshly configured model.

        The job pool's `epoch` counts buffer rebuilds within this model generation: it starts at 0
        and moves on each time quarantined buffers force a rebuild. `chunk_setting` (`chunking.py`)
        decides the prefill chunk and `prefix_reuse` whether lanes park, until `settle_offset`.

        Raises:
            FailedPrecondition: the model lacks a prefill or decode submodel.
            DeviceError: registering host buffers failed.
        """
        prefills = [s for s in model.submodels.values() if s.task_type is TaskType.PREFILL]
        decodes = sorted((s for s in model.submodels.values() if s.task_type is TaskType.DECODE), key=lambda s: s.batch)
        if not prefills or not decodes:
            raise FailedPrecondition(f"model {self.alias}: package needs a prefill and a decode submodel")
        self.prefill = max(prefills, key=lambda s: s.max_tokens)
        self.decodes = decodes
        self.chunked = chunk_setting != CHUNK_OFF
        self.prefill_chunk = chunk_tokens(
            chunk_setting, self.manifest.timing, self.prefill.max_tokens, decodes[-1].batch
        )
        self.prefix_reuse = prefix_reuse
        self.model = model
        caps = device.info().capabilities
        self.fixed_slots = None if caps.lane_selection else caps.inactive_rows
        # With fixed slots a lane past the largest decode batch could never be decoded: not used.
        lanes = min(model.lanes, decodes[-1].batch) if self.fixed_slots else model.lanes
        self.kv = KVManager(lanes, model.lane_context, self.generation, fixed_slots=self.fixed_slots is not None)
        self.jump_min_runs = jump_thresholds(
            self.manifest, self.prefill.name, lambda rows: self.decode_submodel_for(rows).batch, model.lanes
        )
        self.pool = JobPool(device, [self.prefill, *decodes], 0, slots_per_key=1, engine_slots=engine_slots)
        rows = max(s.batch for s in decodes)
        self.sampler = (
            Sampler(model.vocab_size, rows, policy=SamplingPolicy.SERIAL)
            if serial_sampling
            else Sampler(model.vocab_size, rows)
        )

    def settle_offset(self, decision: OffsetDecision) -> None:
        """Serve as the load decided (`prefill_offset.decide`): without prefill at an offset, each
        prompt is one prefill job (up to the prefill bucket), no lane parks and nothing jumps. Called
        under the engine lock, before the generation is published."""
        assert self.prefill is not None
        self.offset = decision
        if not decision.chunked:
            self.chunked, self.prefill_chunk = False, self.prefill.max_tokens
        self.prefix_reuse = self.prefix_reuse and decision.prefix_reuse
        if not decision.jump:
            self.jump_min_runs = ()

    @property
    def limits(self) -> ModelLimits:
        assert self.model is not None and self.prefill is not None
        context = min(self.model.lane_context, self.manifest.context)
        return ModelLimits(
            vocab_size=self.model.vocab_size,
            context=context,
            prefill_tokens=context if self.chunked else self.prefill.max_tokens,  # chunks reach any length
            eos_token_ids=self.eos_ids,
        )

    @property
    def jump_min_run(self) -> int:
        """Forced tokens a jump needs with one stream running (0: the model never jumps)."""
        return self.jump_threshold(1)

    def jump_threshold(self, running: int) -> int:
        """Forced tokens a jump needs with `running` sequences holding lanes (0: none pays)."""
        runs = self.jump_min_runs
        return runs[min(max(running, 1), len(runs)) - 1] if runs else 0

    @property
    def max_decode_batch(self) -> int:
        return self.decodes[-1].batch

    def slot_bound(self, sub: SubmodelInfo) -> bool:
        """Whether a job on `sub` has row i on slot i (fixed slots, `device/slots.py`)."""
        return self.fixed_slots is not None and slot_bound(sub)

    def decode_submodel_for_lanes(self, lanes: list[int]) -> SubmodelInfo:
        """The decode submodel for a job on these lanes: with fixed slots the smallest batch that
        covers the highest slot, else the smallest that holds one row per lane."""
        return self.decode_submodel_for(max(lanes) + 1 if self.fixed_slots else len(lanes))

    def decode_submodel_for(self, rows: int) -> SubmodelInfo:
        """The smallest decode submodel whose batch holds `rows` rows."""
        for info in self.decodes:
            if info.batch >= rows:
                return info
        return self.decodes[-1]
