"""Bad inputs to calsim, each with its exact typed error, and nothing held after a refusal."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.daemon.calsim.device import CalsimDevice, CalsimDriver, CalsimModel
from calculet.daemon.device.errors import ConfigurationError, DeviceNotFound, InvalidJob
from calculet.daemon.device.types import JobSpec, JobStatus, RowSpec
from calculet.daemon.package.manifest import DecodePoint, TensorDecl

from .conftest import OpenDevice
from .factories import (
    BUCKET,
    DECODE1,
    DECODE4,
    LANE_CONTEXT,
    LANES,
    PREFILL,
    TIMING,
    VOCAB,
    Bufs,
    KernelBox,
    decode_spec,
    make_bufs,
    make_manifest,
)

# ---------------------------------------------------------------- submit


def _with(bufs: Bufs, **changes: Any) -> JobSpec:
    base = bufs.spec([RowSpec(0, 0, 1)])
    return replace(base, **changes)


def _swap(bufs: Bufs, device: CalsimDevice, name: str, array: np.ndarray) -> JobSpec:
    buf = device.register_buffer(array)
    spec = bufs.spec([RowSpec(0, 0, 1)])
    if name == "logits":
        return replace(spec, outputs={"logits": buf.buffer_id})
    return replace(spec, inputs={**spec.inputs, name: buf.buffer_id})


def _readonly(shape: tuple[int, ...]) -> np.ndarray:
    arr = np.zeros(shape, dtype=ml_dtypes.bfloat16)
    arr.flags.writeable = False
    return arr


Case = Callable[[CalsimDevice, dict[str, Bufs]], JobSpec]
CASES: list[tuple[str, Case, str]] = [
    ("unknown submodel", lambda d, b: _with(b[DECODE1], submodel="nope"), "unknown submodel 'nope'"),
    ("substring of a name", lambda d, b: _with(b[DECODE1], submodel="decode"), "unknown submodel 'decode'"),
    (
        "unknown buffer",
        lambda d, b: _with(b[DECODE1], inputs={"tokens": 999, "positions": b[DECODE1].positions.buffer_id}),
        "unknown buffer 999",
    ),
    (
        "missing input",
        lambda d, b: _with(b[DECODE1], inputs={"tokens": b[DECODE1].tokens.buffer_id}),
        "must be exactly ['positions', 'tokens']",
    ),
    (
        "extra input",
        lambda d, b: _with(b[DECODE1], inputs={**b[DECODE1].spec([]).inputs, "mask": 1}),
        "must be exactly",
    ),
    ("wrong output name", lambda d, b: _with(b[DECODE1], outputs={"probs": 3}), "must be exactly ['logits']"),
    (
        "tokens dtype",
        lambda d, b: _swap(b[DECODE1], d, "tokens", np.zeros((1, 1), np.int64)),
        "is int64[1, 1], expected int32[1, 1]",
    ),
    (
        "positions shape",
        lambda d, b: _swap(b[DECODE1], d, "positions", np.zeros((4, 1), np.int32)),
        "expected int32[1, 1]",
    ),
    (
        "logits fp32",
        lambda d, b: _swap(b[DECODE1], d, "logits", np.zeros((1, VOCAB), np.float32)),
        f"expected bf16[1, {VOCAB}]",
    ),
    (
        "logits vocab",
        lambda d, b: _swap(b[DECODE1], d, "logits", np.zeros((1, VOCAB + 1), ml_dtypes.bfloat16)),
        f"expected bf16[1, {VOCAB}]",
    ),
    (
        "one buffer twice",
        lambda d, b: _with(
            b[DECODE1], inputs={"tokens": b[DECODE1].tokens.buffer_id, "positions": b[DECODE1].tokens.buffer_id}
        ),
        "named twice",
    ),
    (
        "read-only output",
        lambda d, b: _swap(b[DECODE1], d, "logits", _readonly((1, VOCAB))),
        "read-only",
    ),
    ("no rows", lambda d, b: b[DECODE4].spec([]), "0 rows; expected 1..4"),
    ("rows > batch", lambda d, b: b[DECODE4].spec([RowSpec(i % 4, 0, 1) for i in range(5)]), "5 rows"),
    ("duplicate lanes", lambda d, b: b[DECODE4].spec([RowSpec(1, 0, 1), RowSpec(1, 0, 1)]), "appears twice"),
    ("lane too big", lambda d, b: b[DECODE1].spec([RowSpec(LANES, 0, 1)]), f"lane {LANES} out of range"),
    ("lane negative", lambda d, b: b[DECODE1].spec([RowSpec(-1, 0, 1)]), "lane -1 out of range"),
    ("decode two tokens", lambda d, b: b[DECODE1].spec([RowSpec(0, 0, 2)]), "decode cur_seq_len must be 1"),
    ("prefill zero tokens", lambda d, b: b[PREFILL].spec([RowSpec(0, 0, 0)]), "cur_seq_len 0 outside 1..16"),
    ("prefill over bucket", lambda d, b: b[PREFILL].spec([RowSpec(0, 0, BUCKET + 1)]), "outside 1..16"),
    ("negative past", lambda d, b: b[DECODE1].spec([RowSpec(0, -1, 1)]), "past_kv_len -1 is negative"),
    (
        "decode past context",
        lambda d, b: b[DECODE1].spec([RowSpec(0, LANE_CONTEXT, 1)]),
        f"exceeds the lane context {LANE_CONTEXT}",
    ),
    ("prefill past context", lambda d, b: b[PREFILL].spec([RowSpec(0, 60, 5)]), "exceeds the lane context"),
    (
        "row not a RowSpec",
        lambda d, b: replace(b[DECODE1].spec([]), rows=((0, 0, 1),)),  # type: ignore[arg-type]
        "expected a RowSpec",
    ),
    ("bool lane", lambda d, b: b[DECODE1].spec([RowSpec(True, 0, 1)]), "expected a RowSpec of integers"),
    ("not a JobSpec", lambda d, b: "job", "submit needs a JobSpec"),  # type: ignore[list-item,return-value]
]


@pytest.mark.parametrize(("name", "make", "message"), CASES, ids=[c[0] for c in CASES])
def test_malformed_job_is_invalid_and_holds_nothing(
    device: CalsimDevice, model: CalsimModel, name: str, make: Case, message: str
) -> None:
    bufs = {s: make_bufs(device, model, s) for s in (PREFILL, DECODE1, DECODE4)}
    with pytest.raises(InvalidJob) as info:
        device.submit(model, make(device, bufs))
    assert message in str(info.value)
    assert device.counters().submitted == 0
    # every buffer, lane and bank is still free: a good job on the same resources runs
    ok = device.submit(model, decode_spec(bufs[DECODE4], [(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1)]))
    assert ok.wait(5) is JobStatus.DONE


def test_engine_slot_must_be_an_engine_slot(device: CalsimDevice, model: CalsimModel) -> None:
    bufs = make_bufs(device, model, DECODE1)
    with pytest.raises(InvalidJob, match="engine_slot must be an EngineSlot"):
        device.submit(model, decode_spec(bufs, [(0, 0, 1)]), "ping")  # type: ignore[arg-type]


def _valid(task: str, rows: list[tuple[int, int, int]], held: dict[int, int]) -> bool:
    """`held`: the KV each lane validly holds (what accepted jobs wrote), by the test's own count."""
    batch, max_tokens = (1, BUCKET) if task == PREFILL else (4, 1)
    lanes = [r[0] for r in rows]
    return (
        1 <= len(rows) <= batch
        and len(set(lanes)) == len(lanes)
        and all(0 <= lane < LANES for lane in lanes)
        and all(past >= 0 and 1 <= cur <= max_tokens and past + cur <= LANE_CONTEXT for _, past, cur in rows)
        and all(past <= held.get(lane, 0) for lane, past, _ in rows)
    )


def test_random_rows_are_accepted_exactly_when_valid(device: CalsimDevice, model: CalsimModel) -> None:
    bufs = {PREFILL: make_bufs(device, model, PREFILL), DECODE4: make_bufs(device, model, DECODE4)}
    past = st.one_of(st.just(0), st.integers(-2, LANE_CONTEXT + 2))
    row = st.tuples(st.integers(-1, LANES), past, st.integers(-1, BUCKET + 1))
    held: dict[int, int] = {}  # lane -> valid KV length, kept across examples as the device keeps it

    @settings(max_examples=80, deadline=None)
    @given(st.sampled_from([PREFILL, DECODE4]), st.lists(row, max_size=5))
    def check(task: str, rows: list[tuple[int, int, int]]) -> None:
        spec = bufs[task].spec([RowSpec(*r) for r in rows])
        if _valid(task, rows, held):
            assert device.submit(model, spec).wait(5) is JobStatus.DONE
            held.update({lane: past + cur for lane, past, cur in rows})
        else:
            with pytest.raises(InvalidJob):
                device.submit(model, spec)

    check()


# ---------------------------------------------------------------- buffers


def test_register_buffer_needs_a_c_contiguous_numpy_array(device: CalsimDevice) -> None:
    with pytest.raises(InvalidJob, match="C-contiguous"):
        device.register_buffer(np.zeros((4, 8), np.int32)[:, ::2])
    with pytest.raises(InvalidJob, match="C-contiguous"):
        device.register_buffer(np.asfortranarray(np.zeros((4, 8), np.int32)))
    with pytest.raises(InvalidJob, match="numpy array"):
        device.register_buffer([1, 2, 3])  # type: ignore[arg-type]
    buf = device.register_buffer(np.zeros((4, 8), np.int32))
    assert buf.nbytes == 128


def test_unregister_unknown_or_twice_is_invalid(device: CalsimDevice, open_device: OpenDevice) -> None:
    buf = device.register_buffer(np.zeros(4, np.int32))
    device.unregister_buffer(buf)
    with pytest.raises(InvalidJob, match="not registered"):
        device.unregister_buffer(buf)
    foreign = open_device(board=1).register_buffer(np.zeros(4, np.int32))
    with pytest.raises(InvalidJob, match="not registered"):
        device.unregister_buffer(foreign)


def test_unregistered_buffer_cannot_be_used(device: CalsimDevice, model: CalsimModel) -> None:
    bufs = make_bufs(device, model, DECODE1)
    device.unregister_buffer(bufs.tokens)
    with pytest.raises(InvalidJob, match="unknown buffer"):
        device.submit(model, decode_spec(bufs, [(0, 0, 1)]))


# ---------------------------------------------------------------- driver options and boards


BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"speed": 2}, "unknown calsim options ['speed']"),
    ({"time_scale": -1}, "time_scale: expected a finite number >= 0"),
    ({"time_scale": "fast"}, "time_scale"),
    ({"time_scale": True}, "time_scale"),
    ({"time_scale": float("nan")}, "time_scale"),
    ({"dram_bytes": 0}, "dram_bytes: expected an integer >= 1"),
    ({"sram_bytes": 1.5}, "sram_bytes: expected an integer >= 1"),
    ({"max_resident_configurations": 0}, "max_resident_configurations: expected an integer >= 1"),
    ({"kernel_factory": 3}, "kernel_factory: expected a callable"),
    ({"fault_plan": {"faults": [{"kind": "boom", "job": 0}]}}, "'boom' is not one of"),
    ({"fault_plan": "/nonexistent/plan.json"}, "cannot read"),
    ({"configure_time_scale": -0.5}, "configure_time_scale: expected a finite number >= 0"),
    ({"release_leak_bytes": -1}, "release_leak_bytes: expected an integer >= 0"),
    ({"firmware_version": "calsim-1"}, "firmware_version: expected a version like 1.0.0"),
    ({"profile": "calrt-2.0.0"}, "calrt-0.7.6, calrt-1.0.0, calsim-dev"),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_bad_option_is_invalid_argument(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJob) as info:
        CalsimDriver().open(0, options)
    assert message in str(info.value)
    assert info.value.kind.value == "invalid_argument"


@pytest.mark.parametrize("board", [-1, "0", True, 1.0])
def test_bad_board_is_device_not_found(board: Any) -> None:
    with pytest.raises(DeviceNotFound):
        CalsimDriver().open(board, {"time_scale": 0})


def test_options_must_be_a_mapping() -> None:
    with pytest.raises(InvalidJob, match="mapping"):
        CalsimDriver().open(0, [("time_scale", 0)])  # type: ignore[arg-type]


# ---------------------------------------------------------------- packages calsim cannot run


def _sub(index: int, **changes: Any) -> Callable[[Any], Any]:
    def change(m: Any) -> Any:
        subs = list(m.submodels)
        subs[index] = replace(subs[index], **changes)
        return replace(m, submodels=tuple(subs))

    return change


BAD_PACKAGES: list[tuple[str, Callable[[Any], Any], str]] = [
    ("duplicate names", _sub(1, name=PREFILL), "two submodels named"),
    ("unknown role", _sub(0, role="embed"), "role 'embed' is not prefill or decode"),
    ("decode bucket", _sub(1, max_tokens=2), "decode submodel feeds 1 token per row"),
    (
        "wrong tensor shape",
        _sub(1, inputs=(TensorDecl("tokens", (1, 2), "int32"), TensorDecl("positions", (1, 1), "int32"))),
        "inputs",
    ),
    (
        "extra output",
        _sub(1, outputs=(TensorDecl("logits", (1, VOCAB), "bf16"), TensorDecl("hidden", (1, 8), "bf16"))),
        "outputs",
    ),
    ("no submodels", lambda m: replace(m, submodels=()), "no submodels"),
    ("zero bandwidth", lambda m: replace(m, timing=replace(TIMING, h2d_gbps=0.0)), "timing.h2d_gbps"),
    ("negative alpha", lambda m: replace(m, timing=replace(TIMING, batch_alpha=-1.0)), "timing.batch_alpha"),
    (
        "decode curve speeds up",
        lambda m: replace(m, timing=replace(TIMING, decode_curve=(DecodePoint(0, 2.0), DecodePoint(64, 1.0)))),
        "timing.decode_curve",
    ),
    ("zero lanes", lambda m: replace(m, kv=replace(m.kv, lanes=0)), "lanes"),
]


@pytest.mark.parametrize(("name", "change", "message"), BAD_PACKAGES, ids=[p[0] for p in BAD_PACKAGES])
def test_package_calsim_cannot_run_is_a_configuration_error(
    device: CalsimDevice, tmp_path: Path, name: str, change: Callable[[Any], Any], message: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        device.configure(tmp_path, change(make_manifest()))
    assert message in str(info.value)
    assert all(c.dram_used == 0 for c in device.memory_usage().chips)


def test_kernel_with_another_vocab_is_refused(open_device: OpenDevice, tmp_path: Path) -> None:
    class WrongVocab(KernelBox):
        def __call__(self, manifest: Any, package_dir: Path, lanes: int, lane_context: int) -> Any:
            kernel = super().__call__(manifest, package_dir, lanes, lane_context)
            kernel.vocab_size = 7
            return kernel

    device = open_device(kernel_factory=WrongVocab())
    with pytest.raises(ConfigurationError, match="kernel vocab 7"):
        device.configure(tmp_path, make_manifest())
    assert all(c.dram_used == 0 for c in device.memory_usage().chips)
