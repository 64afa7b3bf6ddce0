"""A package's calbin hash covers its compiled files, not its tokenizer or metadata; the compiler
identities come from the manifest."""

from __future__ import annotations

import dataclasses

from calculet.daemon.package.identity import calbin_sha256, compiler_of
from calculet.daemon.package.manifest import FileEntry, PackageManifest, load_manifest
from calculet.ops.sim_packages import build_sim_package


def manifest_of(tmp_path) -> PackageManifest:  # type: ignore[no-untyped-def]
    root = build_sim_package("tiny", tmp_path / "tiny")
    return load_manifest(root)


def with_file(m: PackageManifest, path: str, role: str, digest: str) -> PackageManifest:
    files = tuple(f if f.path != path else FileEntry(f.path, f.size, digest, f.role) for f in m.files)
    return dataclasses.replace(m, files=files)


def test_the_calbin_hash_follows_compiled_files_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    m = manifest_of(tmp_path)
    base = calbin_sha256(m)
    assert len(base) == 64 and base == calbin_sha256(m)
    by_role = {f.role: f for f in m.files}
    tokenizer, program = by_role["tokenizer"], next(f for f in m.files if f.role not in ("tokenizer", "metadata"))
    assert calbin_sha256(with_file(m, tokenizer.path, "tokenizer", "0" * 64)) == base
    assert calbin_sha256(with_file(m, program.path, program.role, "0" * 64)) != base


def test_the_compiler_identities_are_the_manifests_sorted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    m = manifest_of(tmp_path)
    declared = dataclasses.replace(m.compatibility, compiler={"tvm": "e4f", "calcc": "1.2"})
    assert compiler_of(dataclasses.replace(m, compatibility=declared)) == (("calcc", "1.2"), ("tvm", "e4f"))
