"""`DeviceModel` read from a real calsim package: the copy sizes follow the calsim I/O contract
(prefill and decode take int32 tokens and positions: 8 bytes a token or row in; bf16 logits out:
2 bytes x vocab a row), the batches, lanes and context are the manifest's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from calculet.common.errors import InvalidArgument
from calculet.daemon.package.manifest import load_manifest
from calculet.ops.bench.device_model import DeviceModel
from calculet.ops.sim_packages import build_sim_package


def test_a_tiny_package(tmp_path: Path) -> None:
    package = build_sim_package("tiny", tmp_path / "tiny", decode_batches=[4, 1], lanes=4)
    manifest = load_manifest(package)
    model = DeviceModel.from_manifest(manifest)
    vocab = manifest.architecture.vocab_size
    assert (model.decode_batches, model.lanes, model.context) == ((1, 4), 4, manifest.context)
    assert (model.prefill_h2d_per_token, model.decode_h2d_per_row) == (8, 8)
    assert model.prefill_d2h_per_row == model.decode_d2h_per_row == 2 * vocab
    assert model.timing == manifest.timing
    assert [model.batch_for(r) for r in (1, 2, 4, 5)] == [1, 4, 4, 4]


def test_a_package_without_a_decode_submodel(tmp_path: Path) -> None:
    manifest = load_manifest(build_sim_package("tiny", tmp_path / "tiny"))
    prefill_only = dataclasses.replace(manifest, submodels=tuple(manifest.submodels_for("prefill")))
    with pytest.raises(InvalidArgument, match="needs a prefill and a decode submodel"):
        DeviceModel.from_manifest(prefill_only)
