"""Protobuf -> bench data: the only module of `calculet.ops.bench` that reads protobuf messages.

`utilization_sample(status)` turns a daemon's `StatusResponse.utilization` (observe.proto,
`DeviceUtilization`, field 14) into a `UtilizationSample`, or None when the field is absent (a
daemon built before it). `status_reader(open_client)` makes the `status_of` callable that
`device_stats.sample_boards` needs.
"""

from __future__ import annotations

from collections.abc import Callable

from calculet.client import AsyncDaemonClient
from calculet.ops.bench.device_stats import StatusOf, UtilizationSample
from calculet.v1 import observe_pb2


def utilization_sample(status: observe_pb2.StatusResponse) -> UtilizationSample | None:
    if not status.HasField("utilization"):
        return None
    u = status.utilization
    return UtilizationSample(
        device_s=u.device_seconds,
        busy_s=u.busy_seconds,
        banks=tuple((b.bank, b.busy_seconds) for b in u.banks),
        h2d_s=u.h2d_seconds,
        compute_s=u.compute_seconds,
        d2h_s=u.d2h_seconds,
        sampling_s=u.sampling_seconds,
        generated_tokens=u.generated_tokens,
    )


def status_reader(open_client: Callable[[str], AsyncDaemonClient]) -> StatusOf:
    """`status_of(target)`: one Status call on a fresh client (closed after), converted.

    Raises (when called):
        CalculetError: the client's typed errors (unreachable, refused, bad target).
    """

    async def status_of(target: str) -> UtilizationSample | None:
        async with open_client(target) as client:
            return utilization_sample(await client.status())

    return status_of
