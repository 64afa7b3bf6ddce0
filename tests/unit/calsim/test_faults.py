"""Fault plan: parsing (every bad input has its exact error), selection, and each kind firing on
the device exactly at the planned submit attempt and nowhere else."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from calculet.daemon.calsim.device import CalsimDevice, CalsimModel
from calculet.daemon.calsim.faults import Fault, FaultKind, FaultPlan
from calculet.daemon.device.errors import DeviceLost, InvalidJob, SubmitFailed, WaitTimeout
from calculet.daemon.device.types import EngineSlot, JobStatus

from .conftest import OpenDevice
from .factories import (
    DECODE1,
    LANES,
    bitwise_equal,
    decode_spec,
    expected_row,
    is_poison,
    kernel_of,
    make_bufs,
    make_manifest,
)

SENTINEL = np.array(7.0, dtype=ml_dtypes.bfloat16)

# ---------------------------------------------------------------- parsing


def test_plan_round_trips_through_its_json_form() -> None:
    raw = {
        "seed": 9,
        "faults": [
            {"kind": "ccu_exception", "job": 3},
            {"kind": "slow_job", "job": 5, "delay_ms": 250.0},
            {"kind": "nan_logits", "probability": 0.25},
            {"kind": "hang", "probability": 0.5},
        ],
    }
    plan = FaultPlan.from_dict(raw)
    assert FaultPlan.from_dict(plan.to_dict()).to_dict() == plan.to_dict()
    assert plan.seed == 9
    assert {f.kind for f in plan.faults()} == {
        FaultKind.CCU_EXCEPTION,
        FaultKind.SLOW_JOB,
        FaultKind.NAN_LOGITS,
        FaultKind.HANG,
    }


BAD_PLANS: list[tuple[Any, str]] = [
    ([], "expected an object"),
    ({"faults": [], "extra": 1}, "unknown keys ['extra']"),
    ({"seed": -1, "faults": []}, "seed: expected an integer >= 0"),
    ({"seed": True, "faults": []}, "seed: expected an integer >= 0"),
    ({"faults": {}}, "faults: expected a list"),
    ({"faults": [3]}, "faults[0]: expected an object"),
    ({"faults": [{"kind": "hang", "job": 1, "when": 2}]}, "unknown keys ['when']"),
    ({"faults": [{"kind": "meltdown", "job": 1}]}, "'meltdown' is not one of"),
    ({"faults": [{"kind": "hang", "job": "1"}]}, "job: expected an integer"),
    ({"faults": [{"kind": "hang", "job": 1.0}]}, "job: expected an integer"),
    ({"faults": [{"kind": "hang", "job": -2}]}, "job index must be an integer >= 0"),
    ({"faults": [{"kind": "hang", "job": 1, "probability": 0.5}]}, "either 'job' or 'probability'"),
    ({"faults": [{"kind": "hang"}]}, "give 'job' (attempt index) or 'probability'"),
    ({"faults": [{"kind": "hang", "probability": 1.5}]}, "probability must be in 0..1"),
    ({"faults": [{"kind": "hang", "probability": "often"}]}, "probability: expected a number"),
    ({"faults": [{"kind": "hang", "job": 1, "delay_ms": 5}]}, "delay_ms applies to slow_job only"),
    ({"faults": [{"kind": "slow_job", "job": 1}]}, "delay_ms must be a finite number > 0"),
    ({"faults": [{"kind": "slow_job", "job": 1, "delay_ms": -3}]}, "delay_ms must be a finite number > 0"),
    ({"faults": [{"kind": "hang", "job": 1}, {"kind": "nan_logits", "job": 1}]}, "two faults at job 1"),
    (
        {"faults": [{"kind": "hang", "probability": 0.6}, {"kind": "nan_logits", "probability": 0.5}]},
        "probabilities add up to 1.1 > 1",
    ),
]


@pytest.mark.parametrize(("raw", "message"), BAD_PLANS)
def test_bad_plan_is_refused_with_invalid_job(raw: Any, message: str) -> None:
    with pytest.raises(InvalidJob) as info:
        FaultPlan.from_dict(raw)
    assert message in str(info.value)


def test_plan_loads_from_a_json_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"seed": 1, "faults": [{"kind": "hang", "job": 4}]}))
    plan = FaultPlan.load(str(path))
    assert plan.select(4) == Fault(FaultKind.HANG, job=4)
    assert FaultPlan.load(path).to_dict() == plan.to_dict()


def test_plan_file_errors_are_invalid_job(tmp_path: Path) -> None:
    with pytest.raises(InvalidJob, match="cannot read"):
        FaultPlan.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidJob, match="not valid JSON"):
        FaultPlan.load(bad)
    with pytest.raises(InvalidJob, match="expected a path or an object"):
        FaultPlan.load(42)  # type: ignore[arg-type]


def test_select_fires_only_at_planned_indexes() -> None:
    plan = FaultPlan([Fault(FaultKind.HANG, job=2), Fault(FaultKind.NAN_LOGITS, job=7)])
    hits = {i: f.kind for i in range(50) if (f := plan.select(i)) is not None}
    assert hits == {2: FaultKind.HANG, 7: FaultKind.NAN_LOGITS}


def test_probabilistic_selection_is_seeded_and_near_its_rate() -> None:
    faults = [Fault(FaultKind.NAN_LOGITS, probability=0.2), Fault(FaultKind.HANG, probability=0.1)]
    a, b, other = FaultPlan(faults, seed=3), FaultPlan(faults, seed=3), FaultPlan(faults, seed=4)
    picks = [a.select(i) for i in range(4000)]
    assert picks == [b.select(i) for i in range(4000)]  # same seed, same attempts
    assert picks != [other.select(i) for i in range(4000)]
    nan = sum(1 for p in picks if p is not None and p.kind is FaultKind.NAN_LOGITS)
    hang = sum(1 for p in picks if p is not None and p.kind is FaultKind.HANG)
    assert 0.16 * 4000 < nan < 0.24 * 4000
    assert 0.07 * 4000 < hang < 0.13 * 4000


def test_index_entry_wins_over_probability() -> None:
    plan = FaultPlan([Fault(FaultKind.NAN_LOGITS, probability=1.0), Fault(FaultKind.HANG, job=3)])
    assert plan.select(3) == Fault(FaultKind.HANG, job=3)
    assert plan.select(4) == Fault(FaultKind.NAN_LOGITS, probability=1.0)


def test_inject_targets_next_attempt_and_refuses_the_past() -> None:
    plan = FaultPlan()
    assert plan.inject(Fault(FaultKind.CCU_EXCEPTION), next_index=5) == Fault(FaultKind.CCU_EXCEPTION, job=5)
    with pytest.raises(InvalidJob, match="already submitted"):
        plan.inject(Fault(FaultKind.HANG, job=4), next_index=5)
    with pytest.raises(InvalidJob, match="two faults at job 5"):
        plan.inject(Fault(FaultKind.HANG), next_index=5)


# ---------------------------------------------------------------- on the device


@dataclass
class Outcome:
    """What happened to submit attempt i of `run_decodes`."""

    error: type[Exception] | None = None
    status: JobStatus | None = None
    correct: bool = False  # output row equals the fake kernel's logits
    nan: bool = False
    poisoned: bool = False  # output row still holds the poison calsim wrote at submit
    h2d_delay: float = 0.0


def run_decodes(device: CalsimDevice, model: CalsimModel, count: int) -> list[Outcome]:
    """`count` decode attempts, one at a time, attempt i on lane i % LANES with token 10 + i."""
    bufs = make_bufs(device, model, DECODE1)
    outcomes = []
    for i in range(count):
        bufs.logits.array[...] = SENTINEL
        token = 10 + i
        try:
            sub = device.submit(model, decode_spec(bufs, [(i % LANES, 0, token)]))
        except (SubmitFailed, DeviceLost) as exc:
            outcomes.append(Outcome(error=type(exc)))
            continue
        status = sub.wait(5)
        ts = sub.timestamps()
        assert ts is not None
        row = bufs.out(0)
        outcomes.append(
            Outcome(
                status=status,
                correct=bitwise_equal(row, expected_row([token], [0])),
                nan=bool(np.isnan(row.astype(np.float32)).all()),
                poisoned=is_poison(row),
                h2d_delay=ts.h2d_start - ts.queued,
            )
        )
    return outcomes


def normal(o: Outcome) -> bool:
    return o.error is None and o.status is JobStatus.DONE and o.correct and o.h2d_delay == 0.0


def plan_of(kind: str, job: int, **extra: Any) -> dict[str, Any]:
    return {"faults": [{"kind": kind, "job": job, **extra}]}


def test_submit_error_fires_once_and_holds_nothing(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan=plan_of("submit_error", 2))
    model = device.configure(tmp_path, make_manifest())
    out = run_decodes(device, model, 6)
    assert out[2].error is SubmitFailed
    assert all(normal(o) for i, o in enumerate(out) if i != 2)  # attempt 3 reused the same buffers
    counters = device.counters()
    assert counters.submitted == 5 and counters.finished == 5 and counters.left == 0


def test_ccu_exception_fires_once_skips_outputs_and_corrupts_its_lanes(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan=plan_of("ccu_exception", 1))
    model = device.configure(tmp_path, make_manifest())
    out = run_decodes(device, model, 5)
    assert out[1].status is JobStatus.CCU_EXCEPTION and out[1].poisoned
    assert all(normal(o) for i, o in enumerate(out) if i != 1)
    assert kernel_of(model).lanes_touched("corrupt") == [1]


def test_nan_logits_fires_once(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan=plan_of("nan_logits", 3))
    model = device.configure(tmp_path, make_manifest())
    out = run_decodes(device, model, 6)
    assert out[3].status is JobStatus.DONE and out[3].nan and not out[3].poisoned
    assert all(normal(o) and not o.nan for i, o in enumerate(out) if i != 3)
    kernel = kernel_of(model)
    assert kernel.history(3, 1) == ([13], [0])  # KV was written normally


def test_slow_job_delays_only_its_h2d_by_the_planned_modelled_time(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan=plan_of("slow_job", 2, delay_ms=40.0))
    model = device.configure(tmp_path, make_manifest())
    out = run_decodes(device, model, 5)
    assert out[2].status is JobStatus.DONE and out[2].correct
    assert out[2].h2d_delay == pytest.approx(0.040)
    assert all(normal(o) for i, o in enumerate(out) if i != 2)


def test_hang_never_finishes_until_reset_ccu(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan=plan_of("hang", 1))
    model = device.configure(tmp_path, make_manifest())
    assert all(normal(o) for o in run_decodes(device, model, 1))
    bufs = make_bufs(device, model, DECODE1)
    bufs.logits.array[...] = SENTINEL
    hung = device.submit(model, decode_spec(bufs, [(2, 0, 5)]))
    with pytest.raises(WaitTimeout):
        hung.wait(0.05)
    assert hung.timestamps() is None
    assert device.counters().left == 1
    device.reset_ccu()
    assert hung.wait(5) is JobStatus.CCU_EXCEPTION
    assert is_poison(bufs.out(0))  # a CCU exception delivers no outputs
    assert kernel_of(model).lanes_touched("corrupt") == [2]
    assert device.counters().left == 0
    # the device works again afterwards, and nothing else hangs
    assert all(normal(o) for o in run_decodes(device, model, 3))


def test_hang_ends_with_reset_configuration_which_clears_every_lane(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan=plan_of("hang", 0))
    model = device.configure(tmp_path, make_manifest())
    bufs = make_bufs(device, model, DECODE1)
    hung = device.submit(model, decode_spec(bufs, [(1, 0, 5)]))
    with pytest.raises(WaitTimeout):
        hung.wait(0.02)
    device.reset_configuration(model)
    assert hung.wait(5) is JobStatus.CCU_EXCEPTION
    assert sorted(kernel_of(model).lanes_touched("clear")) == list(range(LANES))
    ts = hung.timestamps()
    assert ts is not None and ts.compute_end == ts.compute_start  # cut at the reset


def test_device_lost_fires_at_its_attempt_and_every_later_call_raises(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan=plan_of("device_lost", 2))
    model = device.configure(tmp_path, make_manifest())
    bufs = make_bufs(device, model, DECODE1)
    earlier = device.submit(model, decode_spec(bufs, [(0, 0, 1)]))
    earlier.wait(5)
    out = run_decodes(device, model, 1)  # attempt 1: fine
    assert normal(out[0]) and device.healthy()
    with pytest.raises(DeviceLost):
        device.submit(model, decode_spec(bufs, [(0, 0, 1)]))
    assert not device.healthy()
    calls = [
        device.info,
        device.counters,
        device.memory_usage,
        device.reset_ccu,
        lambda: device.submit(model, decode_spec(bufs, [(0, 0, 1)])),
        lambda: device.register_buffer(np.zeros(4, dtype=np.int32)),
        lambda: device.unregister_buffer(bufs.tokens),
        lambda: device.configure(tmp_path, make_manifest("other")),
        lambda: device.release(model),
        lambda: device.reset_configuration(model),
        lambda: device.inject(Fault(FaultKind.HANG)),
        earlier.status,
        earlier.wait,
        earlier.timestamps,
    ]
    for call in calls:
        with pytest.raises(DeviceLost):
            call()
    device.close()  # still closes cleanly
    device.close()


def test_device_lost_wakes_a_waiter_of_an_in_flight_job(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan={"faults": [{"kind": "hang", "job": 0}, {"kind": "device_lost", "job": 1}]})
    model = device.configure(tmp_path, make_manifest())
    a, b = make_bufs(device, model, DECODE1), make_bufs(device, model, DECODE1)
    hung = device.submit(model, decode_spec(a, [(0, 0, 1)]))
    with pytest.raises(DeviceLost):
        device.submit(model, decode_spec(b, [(1, 0, 1)]))
    with pytest.raises(DeviceLost):
        hung.wait(5)


def test_probabilistic_plan_fires_exactly_where_the_plan_selects(open_device: OpenDevice, tmp_path: Path) -> None:
    raw = {"seed": 11, "faults": [{"kind": "nan_logits", "probability": 0.3}]}
    device = open_device(fault_plan=raw)
    model = device.configure(tmp_path, make_manifest())
    out = run_decodes(device, model, 24)
    oracle = FaultPlan.from_dict(raw)
    planned = {i for i in range(24) if oracle.select(i) is not None}
    assert planned and planned != set(range(24))
    assert {i for i, o in enumerate(out) if o.nan} == planned
    assert all(normal(o) for i, o in enumerate(out) if i not in planned)


def test_injected_fault_hits_the_next_attempt_only(device: CalsimDevice, model: CalsimModel) -> None:
    assert all(normal(o) for o in run_decodes(device, model, 2))
    planned = device.inject(Fault(FaultKind.CCU_EXCEPTION))
    assert planned.job == 2
    assert device.fault_plan()["faults"] == [{"kind": "ccu_exception", "job": 2}]
    out = run_decodes(device, model, 3)
    assert out[0].status is JobStatus.CCU_EXCEPTION
    assert normal(out[1]) and normal(out[2])


def test_clear_faults_and_next_job_index_count_refused_attempts(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan=plan_of("ccu_exception", 2))
    model = device.configure(tmp_path, make_manifest())
    bufs = make_bufs(device, model, DECODE1)
    with pytest.raises(InvalidJob):
        device.submit(model, decode_spec(bufs, [(LANES, 0, 1)]))
    assert device.next_job_index() == 1 and device.counters().submitted == 0
    device.clear_faults()
    assert device.fault_plan()["faults"] == []
    assert all(normal(o) for o in run_decodes(device, model, 3))  # attempt 2 no longer faults


def test_fault_of_a_refused_attempt_is_dropped(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan=plan_of("ccu_exception", 1))
    model = device.configure(tmp_path, make_manifest())
    bufs = make_bufs(device, model, DECODE1)
    device.submit(model, decode_spec(bufs, [(0, 0, 1)])).wait(5)  # attempt 0
    with pytest.raises(InvalidJob):  # attempt 1 carries the fault but is malformed
        device.submit(model, decode_spec(bufs, [(LANES, 0, 1)]))
    out = run_decodes(device, model, 2)  # attempts 2, 3
    assert all(normal(o) for o in out)
    assert kernel_of(model).lanes_touched("corrupt") == []


def test_ccu_exception_job_on_a_batch_corrupts_every_lane_it_named(open_device: OpenDevice, tmp_path: Path) -> None:
    device = open_device(fault_plan=plan_of("ccu_exception", 0))
    model = device.configure(tmp_path, make_manifest())
    bufs = make_bufs(device, model, "decode_b4")
    sub = device.submit(model, decode_spec(bufs, [(3, 0, 1), (1, 0, 2)]), EngineSlot.PONG)
    assert sub.wait(5) is JobStatus.CCU_EXCEPTION
    assert sorted(kernel_of(model).lanes_touched("corrupt")) == [1, 3]
