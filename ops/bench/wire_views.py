"""Protobuf -> bench data: the only module of `calculet.ops.bench` that reads protobuf messages.

`utilization_sample(status)` turns a daemon's `StatusResponse.utilization` (observe.proto,
`DeviceUtilization`, field 14) into a `UtilizationSample`, or None when the field is absent (a
daemon built before it). `status_reader(open_client)` makes the `status_of` callable that
`device_stats.sample_boards` needs; each sample carries the board's versions (`versions_of`:
Runtime, driver, firmware, and each model's package, calbin hash and compiler). `serving_of(status)`
reads the board's policy and in-flight limit (fields 9 and 10) for the timing model
(`limit.Serving`); `serving_reader` is its `status_of`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from calculet.client import AsyncDaemonClient
from calculet.common.errors import FailedPrecondition
from calculet.ops.bench.device_stats import BoardVersions, ModelVersion, SlotSample, StatusOf, UtilizationSample
from calculet.ops.bench.limit import Policy, Serving
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
        versions=versions_of(status),
        d2h_bytes=u.d2h_bytes,
        sampled_rows=u.sampled_rows,
        full_row_reads=u.full_row_reads,
        d2d_s=u.d2d_seconds,
        d2d_bytes=u.d2d_bytes,
        slots=slot_sample(status),
    )


def slot_sample(status: observe_pb2.StatusResponse) -> SlotSample | None:
    """The models' decode rows and compactions summed (ModelStatus.slots), None when no model says."""
    slots = [m.slots for m in status.models if m.HasField("slots")]
    if not slots:
        return None
    return SlotSample(
        active_rows=sum(s.active_rows for s in slots),
        compiled_rows=sum(s.compiled_rows for s in slots),
        compactions=sum(s.compactions for s in slots),
        fixed=any(s.fixed for s in slots),
    )


def versions_of(status: observe_pb2.StatusResponse) -> BoardVersions:
    """The Runtime, driver and firmware versions and the models' packages a Status reports."""
    d = status.device
    models = tuple(
        ModelVersion(
            m.alias, m.generation, m.package_name, m.package_hash, m.calbin_sha256, tuple(sorted(m.compiler.items()))
        )
        for m in status.models
    )
    return BoardVersions(d.runtime_version, d.driver_version, d.firmware_version, models)


def status_reader(open_client: Callable[[str], AsyncDaemonClient]) -> StatusOf:
    """`status_of(target)`: one Status call on a fresh client (closed after), converted.

    Raises (when called):
        CalculetError: the client's typed errors (unreachable, refused, bad target).
    """

    async def status_of(target: str) -> UtilizationSample | None:
        async with open_client(target) as client:
            return utilization_sample(await client.status())

    return status_of


_POLICIES = {observe_pb2.POLICY_CONTINUOUS: Policy.CONTINUOUS, observe_pb2.POLICY_SERIAL: Policy.SERIAL}


def serving_of(status: observe_pb2.StatusResponse) -> Serving:
    """Raises: FailedPrecondition: the daemon does not say its policy (one older than the field)."""
    policy = _POLICIES.get(status.policy)
    if policy is None or status.max_inflight not in (1, 2):
        raise FailedPrecondition(
            f"the daemon's Status says no policy/in-flight limit ({status.policy}/{status.max_inflight})"
        )
    return Serving(policy, status.max_inflight)


def serving_reader(open_client: Callable[[str], AsyncDaemonClient]) -> Callable[[str], Awaitable[Serving]]:
    """`serving(target)`: one Status call on a fresh client, the board's policy and in-flight limit.

    Raises (when called):
        CalculetError: the client's typed errors; FailedPrecondition: see `serving_of`.
    """

    async def serving(target: str) -> Serving:
        async with open_client(target) as client:
            return serving_of(await client.status())

    return serving
