"""One model generation being served: the configured model and everything built for it.

A `ModelRuntime` is created by the ModelManager when a package is configured and lives until
that generation is unloaded. It bundles what the engine needs per generation: the device's
`ConfiguredModel`, the `KVManager` for its lanes, the `JobPool` of its host buffers, the
`Sampler`, and the submodels chosen for prefill and decode. Nothing in it outlives the
generation; a completion carrying another generation never touches it.
"""

from __future__ import annotations

from pathlib import Path

from calculet.daemon.core.jobs import JobPool
from calculet.daemon.core.kv import KVManager
from calculet.daemon.core.model_state import MODEL_TRANSITIONS, ModelState
from calculet.daemon.core.request import ModelLimits
from calculet.daemon.device.api import ConfiguredModel, VirtualDevice
from calculet.daemon.device.types import EngineSlot, SubmodelInfo, TaskType
from calculet.daemon.errors import FailedPrecondition
from calculet.daemon.lifecycle import Lifecycle
from calculet.daemon.package.manifest import PackageManifest
from calculet.daemon.sampling.sampler import Sampler, SamplingPolicy


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
        self.message = ""
        self.ready_at: float | None = None  # unix time of publication
        self.drained_jobs = 0  # jobs that finished while it drained for unload
        self.interrupted_jobs = 0  # jobs the drain timeout cut off (ERROR + UNAVAILABLE)

    @property
    def state(self) -> ModelState:
        return self.lifecycle.state

    def attach(
        self,
        device: VirtualDevice,
        model: ConfiguredModel,
        engine_slots: tuple[EngineSlot, ...],
        serial_sampling: bool = False,
    ) -> None:
        """Build the per-generation state around a freshly configured model.

        The job pool's `epoch` counts buffer rebuilds within this model generation: it starts at 0
        and moves on each time quarantined buffers force a rebuild.

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
        self.model = model
        self.kv = KVManager(model.lanes, model.lane_context, self.generation)
        self.pool = JobPool(device, [self.prefill, *decodes], 0, slots_per_key=1, engine_slots=engine_slots)
        rows = max(s.batch for s in decodes)
        self.sampler = (
            Sampler(model.vocab_size, rows, policy=SamplingPolicy.SERIAL)
            if serial_sampling
            else Sampler(model.vocab_size, rows)
        )

    @property
    def limits(self) -> ModelLimits:
        assert self.model is not None and self.prefill is not None
        return ModelLimits(
            vocab_size=self.model.vocab_size,
            context=min(self.model.lane_context, self.manifest.context),
            prefill_tokens=self.prefill.max_tokens,
            eos_token_ids=self.eos_ids,
        )

    @property
    def max_decode_batch(self) -> int:
        return self.decodes[-1].batch

    def decode_submodel_for(self, rows: int) -> SubmodelInfo:
        """The smallest decode submodel whose batch holds `rows` rows."""
        for info in self.decodes:
            if info.batch >= rows:
                return info
        return self.decodes[-1]
