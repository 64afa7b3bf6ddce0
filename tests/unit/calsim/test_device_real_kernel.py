"""calsim with its default kernel factory (`make_kernel` -> the synthetic kernel): the engine and
the real kernel together give deterministic outputs that follow each lane's KV contents."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calculet.daemon.calsim.device import CalsimDevice, CalsimDriver
from calculet.daemon.calsim.kernel import make_kernel
from calculet.daemon.device.types import JobStatus

from .factories import DECODE4, PREFILL, decode_spec, make_bufs, make_manifest, prefill_spec


def _run(device: CalsimDevice, tmp_path: Path) -> list[bytes]:
    model = device.configure(tmp_path, make_manifest())
    assert type(model.kernel).__name__ == "SyntheticKernel"
    pre, dec = make_bufs(device, model, PREFILL), make_bufs(device, model, DECODE4)
    outs = []
    for lane, toks in ((0, [5, 6, 7]), (1, [5, 6, 7]), (2, [5, 6, 8])):
        assert device.submit(model, prefill_spec(pre, lane, toks)).wait(5) is JobStatus.DONE
        outs.append(pre.out(0).tobytes())
    assert device.submit(model, decode_spec(dec, [(0, 3, 9), (1, 3, 9), (2, 3, 9)])).wait(5) is JobStatus.DONE
    outs += [dec.out(i).tobytes() for i in range(3)]
    assert np.isfinite(dec.logits.array[:3].astype(np.float32)).all()
    return outs


def test_default_kernel_factory_runs_the_synthetic_kernel(tmp_path: Path) -> None:
    runs = []
    for scale in (0.0, 0.001):
        device = CalsimDriver().open(0, {"time_scale": scale, "kernel_factory": make_kernel})
        try:
            runs.append(_run(device, tmp_path))
        finally:
            device.close()
    assert runs[0] == runs[1]
    pre0, pre1, pre2, dec0, dec1, dec2 = runs[0]
    assert pre0 == pre1 and dec0 == dec1  # same KV contents, same logits, whatever the lane
    assert pre0 != pre2 and dec0 != dec2  # different history, different logits
