"""Fixtures for the calsim device tests; the factories themselves live in `factories.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from calculet.daemon.calsim.device import CalsimDevice, CalsimDriver, CalsimModel

from .factories import KernelBox, make_manifest

OpenDevice = Callable[..., CalsimDevice]


@pytest.fixture
def kernels() -> KernelBox:
    return KernelBox()


@pytest.fixture
def open_device(kernels: KernelBox) -> Iterator[OpenDevice]:
    """Open calsim boards (time_scale 0, the fake kernel and the two-model `calsim-dev` profile unless
    overridden, so tests may configure models side by side); closed at teardown."""
    opened: list[CalsimDevice] = []

    def _open(board: int = 0, **options: Any) -> CalsimDevice:
        opts: dict[str, Any] = {"time_scale": 0.0, "kernel_factory": kernels, "profile": "calsim-dev"}
        opts.update(options)
        device = CalsimDriver().open(board, opts)
        opened.append(device)
        return device

    yield _open
    for device in opened:
        device.close()


@pytest.fixture
def device(open_device: OpenDevice) -> CalsimDevice:
    return open_device()


@pytest.fixture
def model(device: CalsimDevice, tmp_path: Path) -> CalsimModel:
    return device.configure(tmp_path, make_manifest())
