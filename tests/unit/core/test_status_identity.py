"""Status names each model's package by its manifest hash, its calbin hash and its compiler
identities, on the core's view and on the wire."""

from __future__ import annotations

import hashlib
from pathlib import Path

from calculet.daemon.core.config import DaemonConfig
from calculet.daemon.core.device_core import DeviceCore
from calculet.daemon.package.identity import calbin_sha256, compiler_of
from calculet.daemon.package.manifest import MANIFEST_NAME, load_manifest
from calculet.daemon.wire_views import status_to_pb
from calculet.ops.sim_packages import build_sim_package


def test_status_reports_the_package_identities(tmp_path: Path) -> None:
    package = build_sim_package("tiny", tmp_path / "tiny")
    manifest = load_manifest(package)
    config = DaemonConfig(models_root=tmp_path, models=(("tiny", "tiny"),), device_options={"time_scale": 0.0})
    core = DeviceCore(config)
    core.start()
    try:
        (model,) = core.status().models
        pb = status_to_pb(core.status()).models[0]
    finally:
        core.close()
    assert model.package_hash == hashlib.sha256((package / MANIFEST_NAME).read_bytes()).hexdigest()
    assert model.calbin_sha256 == calbin_sha256(manifest) != model.package_hash
    assert model.compiler == compiler_of(manifest)
    assert pb.calbin_sha256 == model.calbin_sha256 and dict(pb.compiler) == dict(model.compiler)
