"""A package's identity beyond its manifest hash, for benchmark and audit reports (docs/sources.md
001 §11: the Runtime, driver, firmware, compiler and calbin hash go with every measurement).

- `compiler`: the manifest's `compatibility.compiler` map (e.g. the calcc and tvm commits).
- `calbin_sha256`: the SHA-256 of the compiled artefact: over the sorted lines `SHA256  PATH` of
  every file the manifest lists other than the tokenizer's and metadata. Two packages that differ
  only in their tokenizer, template or metadata share it; a rebuilt calbin changes it. Computed
  from the manifest's own file hashes (which the validator checked against the files), so it reads
  no file.
"""

from __future__ import annotations

import hashlib

from calculet.daemon.package.manifest import PackageManifest

NOT_CALBIN_ROLES = frozenset({"tokenizer", "metadata"})


def calbin_sha256(manifest: PackageManifest) -> str:
    """The compiled artefact's hash (module docstring)."""
    lines = sorted(f"{f.sha256}  {f.path}" for f in manifest.files if f.role not in NOT_CALBIN_ROLES)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def compiler_of(manifest: PackageManifest) -> tuple[tuple[str, str], ...]:
    """The declared compiler identities, by name."""
    return tuple(sorted(manifest.compatibility.compiler.items()))
