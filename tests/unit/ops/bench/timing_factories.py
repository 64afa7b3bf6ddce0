"""A small, round timing table for the timing-model tests, so every expected value is worked out by
hand in the tests (never by calling the code under test).

The table: batch-1 decode `t1(L) = 10 + 0.1 L` ms for KV length L in 0..100, flat 20 ms above;
prefill `5 ms + 1 ms a token` plus the attention reads `sum(t1(i) - t1(0))`; batch-B decode
`t1 * (1 + 0.5 (B - 1))`; copies at 1e6 B/s (gbps 0.001): a prefill moves 1,000 B a prompt token
in (1 ms) and 2,000 B a row out (2 ms), a decode step 1,000 B a row in (1 ms) and 2,000 B a row out
(2 ms).
"""

from __future__ import annotations

from calculet.daemon.package.manifest import DecodePoint, TimingDecl
from calculet.ops.bench.device_model import DeviceModel

TIMING = TimingDecl(
    decode_curve=(DecodePoint(0, 10.0), DecodePoint(100, 20.0)),
    prefill_fixed_ms=5.0,
    prefill_ms_per_token=1.0,
    batch_alpha=0.5,
    h2d_gbps=0.001,
    d2h_gbps=0.001,
)


def device_model(batches: tuple[int, ...] = (1, 2), lanes: int = 2, context: int = 200) -> DeviceModel:
    return DeviceModel(
        timing=TIMING,
        decode_batches=batches,
        lanes=lanes,
        context=context,
        prefill_h2d_per_token=1000,
        prefill_d2h_per_row=2000,
        decode_h2d_per_row=1000,
        decode_d2h_per_row=2000,
    )
