"""The suite's calsim packages: one per package key of the matrix, built once and reused.

`<models root>/<preset>-serial`: decode batch 1 with the preset's default lanes (the qwen preset: one
lane holding the whole 40,960-token context, today's production calbin). `<models root>/<preset>-bB`:
decode batch B ONLY, with `lanes` lanes (the largest batch of the suite), so the continuous
configurations differ only in their compiled batch. A package is rebuilt when its manifest is
missing or declares other batches or lanes, then validated (`validate_package`) either way.
Data flow: `FleetSpec.package_key` -> `ensure` -> (package directory, `DeviceModel`) -> fleet and
timing model. Builds go through `calculet.ops.sim_packages.build_sim_package` (`calctl package
build-sim`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from calculet.common.errors import CalculetError, FailedPrecondition
from calculet.daemon.package.manifest import MANIFEST_NAME, load_manifest
from calculet.daemon.package.validate import validate_package
from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.sim_packages import build_sim_package


@dataclass(frozen=True)
class SuitePackage:
    """A built, valid package: its directory name under the models root, path, timing model and
    vocabulary size (the prompts' token ids are drawn below it)."""

    name: str
    path: Path
    model: DeviceModel
    vocab: int


def _wanted(key: str, lanes: int) -> tuple[tuple[int, ...], int | None]:
    """(decode batches, lanes or None for the preset's default) of a package key."""
    if key == "serial":
        return (1,), None
    return (int(key.removeprefix("b")),), lanes


def _matches(path: Path, batches: tuple[int, ...], lanes: int | None) -> bool:
    if not (path / MANIFEST_NAME).exists():
        return False
    try:
        model = DeviceModel.from_manifest(load_manifest(path))
    except CalculetError:
        return False
    return model.decode_batches == batches and (lanes is None or model.lanes == lanes)


def ensure(models_root: Path, preset: str, key: str, lanes: int, say: Callable[[str], None]) -> SuitePackage:
    """The package of `key` (`serial` or `bB`) under `models_root`, built unless a matching one is there.

    Raises:
        CalculetError: the build failed (bad preset, missing `calculet[sim]` extra, does not fit).
        FailedPrecondition: the package does not validate.
    """
    name = f"{preset}-{key}"
    path = models_root / name
    batches, want_lanes = _wanted(key, lanes)
    if not _matches(path, batches, want_lanes):
        say(f"== building calsim package {name} (decode batch {batches[0]}, lanes {want_lanes or 'default'})")
        build_sim_package(preset, path, decode_batches=batches, lanes=want_lanes, force=True)
    report = validate_package(path)
    if not report.ok:
        raise FailedPrecondition(f"package {path} is invalid:\n{report.render_text()}")
    manifest = load_manifest(path)
    return SuitePackage(name, path.resolve(), DeviceModel.from_manifest(manifest), manifest.architecture.vocab_size)
