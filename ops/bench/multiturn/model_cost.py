"""What the timing model says a turn's first token costs when only its uncached tokens are prefilled.

For a request of `p` prompt tokens of which the server served `c` from cache (usage's
`cached_tokens`), the uncached part is `n = max(1, p - c)` tokens prefilled after `c` KV entries
(a chunked prefill pays the same compute in several jobs). Issue 19 relates the turn's TTFT to that
part's prefill plus one decode step; in modelled seconds, with calsim's own duration functions
(`daemon/calsim/timing.py`, as `limit.py` uses them) and the package's copy sizes (`DeviceModel`):

    uncached_ttft = h2d(n tokens) + prefill_ms(n, past=c) + d2h(one row)          (the prefill)
                  + h2d(rows) + decode_ms(batch_for(rows), c + n + 1) + d2h(rows)  (one decode step)

`rows` is the run's decode rows per step (`limit.rows_at_load`, as the `timing_model` section
computes them). At time scale `s` the wall figure is `s` times the modelled one. Pure functions.
"""

from __future__ import annotations

from calculet.common.errors import InvalidArgument
from calculet.daemon.calsim.timing import copy_s, decode_ms, prefill_ms
from calculet.ops.bench.device_model import DeviceModel


def uncached_ttft_s(model: DeviceModel, prompt: int, cached: int, rows: int) -> float:
    """Modelled seconds of the uncached part's prefill plus one decode step (module docstring).

    Args:
        model: the package's timing model.
        prompt: the request's prompt tokens.
        cached: of them, served from cache (clipped to `prompt - 1`: at least one token is prefilled).
        rows: decode rows per step (1 .. lanes).

    Raises:
        InvalidArgument: prompt < 1, cached < 0, or rows outside 1..lanes.
    """
    if prompt < 1 or cached < 0:
        raise InvalidArgument(f"uncached cost: need prompt >= 1 and cached >= 0, got {prompt} / {cached}")
    if not 1 <= rows <= model.lanes:
        raise InvalidArgument(f"rows: must be in 1..{model.lanes} (the lanes), got {rows}")
    t = model.timing
    past = min(cached, prompt - 1)
    n = prompt - past
    prefill = (
        copy_s(n * model.prefill_h2d_per_token, t.h2d_gbps)
        + prefill_ms(t, n, past) / 1000.0
        + copy_s(model.prefill_d2h_per_row, t.d2h_gbps)
    )
    step = (
        copy_s(rows * model.decode_h2d_per_row, t.h2d_gbps)
        + decode_ms(t, model.batch_for(rows), prompt + 1) / 1000.0
        + copy_s(rows * model.decode_d2h_per_row, t.d2h_gbps)
    )
    return prefill + step
