"""Package contents: vendor-shaped layout, every file listed with the right size/hash/role, nothing else."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from calculet.daemon.package.manifest import MANIFEST_NAME, load_manifest
from calculet.ops.sim_packages import PRESETS, build_sim_package

BANKS = ("ping", "pong")
TOKENIZER_FILES = {
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
    "tokenizer/chat_template.jinja",
}


def _files_on_disk(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_dir()}


def test_every_file_listed_with_true_size_and_hash(any_pkg: Path) -> None:
    manifest = load_manifest(any_pkg)
    for entry in manifest.files:
        data = (any_pkg / entry.path).read_bytes()
        assert entry.size == len(data), entry.path
        assert entry.sha256 == hashlib.sha256(data).hexdigest(), entry.path


def test_nothing_unlisted_and_nothing_listed_twice(any_pkg: Path) -> None:
    listed = [e.path for e in load_manifest(any_pkg).files]
    assert len(listed) == len(set(listed))
    assert _files_on_disk(any_pkg) == set(listed) | {MANIFEST_NAME}


def test_vendor_layout(any_pkg: Path) -> None:
    manifest = load_manifest(any_pkg)
    chips = [c.chip for c in manifest.memory.chips]  # one parameter block and command pair per chip used
    expected = {*(f"param_blk{c}.bin" for c in chips), *TOKENIZER_FILES}
    files = {"submodel_memory_reserved_info.txt", *(f"cpu_chip{c}_{bank}.bin" for c in chips for bank in BANKS)}
    assert chips == [0, 1] or manifest.topology.chips == 1
    for sub in manifest.submodels:
        expected |= {f"{sub.folder}/{name}" for name in files}
    assert {e.path for e in manifest.files} == expected
    assert {s.folder for s in manifest.submodels} == {s.name for s in manifest.submodels}


def test_roles(any_pkg: Path) -> None:
    manifest = load_manifest(any_pkg)
    roles = {e.path: e.role for e in manifest.files}
    for path, role in roles.items():
        if path.startswith("param_blk"):
            # tiny ships real numeric weights; qwen only small stand-ins for the vendor blocks.
            assert role == {"numeric": "weights", "synthetic": "params-standin"}[manifest.kernel]
        elif path.startswith("tokenizer/"):
            assert role == "tokenizer"
        elif path.endswith(".txt"):
            assert role == "metadata"
        else:
            assert path.endswith(".bin") and role == "command", path


def test_submodel_info_names_the_right_type(any_pkg: Path) -> None:
    for sub in load_manifest(any_pkg).submodels:
        text = (any_pkg / sub.folder / "submodel_memory_reserved_info.txt").read_text()
        fields = dict(line.split(": ", 1) for line in text.splitlines() if not line.startswith("#"))
        assert fields["smodel_name"] == sub.name
        assert fields["smodel_type"] == {"prefill": "llm_prefill", "decode": "llm_decode"}[sub.role]
        assert int(fields["batch"]) == sub.batch


def test_command_standins_are_distinct_and_tiny(any_pkg: Path) -> None:
    files = [e for e in load_manifest(any_pkg).files if e.role == "command"]
    assert all(e.size <= 256 for e in files)
    assert len({e.sha256 for e in files}) == len(files)


def test_manifest_round_trips_through_the_schema(any_pkg: Path) -> None:
    raw = json.loads((any_pkg / MANIFEST_NAME).read_text())
    assert load_manifest(any_pkg).to_dict() == raw


def test_build_is_reproducible(tmp_path: Path, any_pkg: Path) -> None:
    preset = {p.package_name: name for name, p in PRESETS.items()}[load_manifest(any_pkg).name]
    again = build_sim_package(preset, tmp_path / "again")
    # The manifest holds every file's hash, so equal manifests mean byte-identical packages.
    assert (again / MANIFEST_NAME).read_bytes() == (any_pkg / MANIFEST_NAME).read_bytes()
