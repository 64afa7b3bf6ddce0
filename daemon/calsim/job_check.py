"""Submit-time job validation: a `JobSpec` against a configured model and the registered buffers.

Data flow: `CalsimDevice.submit` -> `resolve_job(...)` under the device lock, BEFORE anything is
held; the returned `ResolvedJob` (buffers looked up, rows checked) is what the engine queues.
Every malformed job raises `InvalidJob` naming the problem; nothing here mutates state.
Token values are not checked here: they are read at H2D time and checked by `compute.py`.
A device without lane selection (option `lane_selection`) also checks the fixed-slot rules
(`device/slots.py`): a masked row is named but reads, writes and moves no KV.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from calculet.daemon.calsim.model_check import NUMPY_DTYPES
from calculet.daemon.calsim.timing import d2h_bytes, h2d_bytes
from calculet.daemon.device.api import HostBuffer
from calculet.daemon.device.errors import InvalidJob
from calculet.daemon.device.slots import check_slot_rows, slot_bound
from calculet.daemon.device.types import DeviceCapabilities, JobSpec, RowSpec, SubmodelInfo, TaskType, TensorSpec


@dataclass(frozen=True)
class ModelGeometry:
    """What validation needs of a configured model.

    Attributes:
        submodels: exact name -> description.
        lanes: KV lanes 0..lanes-1.
        context: submodel name -> KV tokens a row may reach (min of lane context and the
            submodel's compiled context).
    """

    submodels: Mapping[str, SubmodelInfo]
    lanes: int
    context: Mapping[str, int]


@dataclass(frozen=True)
class ResolvedJob:
    """A validated job: its submodel, buffers and rows. The buffers belong to the caller; the
    engine holds them (by id) from acceptance until the job finishes.

    Attributes:
        rows: every row the job names, masked ones (fixed slots) included.
        fixed_slots: the device has no lane selection and the job is slot-bound: its copies move
            all B rows of the compiled batch, whatever is active (`device/slots.py`).
    """

    submodel: SubmodelInfo
    inputs: Mapping[str, HostBuffer]
    outputs: Mapping[str, HostBuffer]
    rows: tuple[RowSpec, ...]
    fixed_slots: bool = False

    @property
    def buffer_ids(self) -> tuple[int, ...]:
        return tuple(b.buffer_id for b in (*self.inputs.values(), *self.outputs.values()))

    @property
    def active(self) -> tuple[RowSpec, ...]:
        """The rows that read and write KV (all but the masked ones)."""
        return tuple(r for r in self.rows if not r.is_masked)

    @property
    def lanes(self) -> tuple[int, ...]:
        """The KV lanes the job advances (a masked row's slot is not one)."""
        return tuple(r.lane for r in self.active)

    @property
    def input_bytes(self) -> int:
        """What H2D moves: the new tokens of the active rows of every input (`timing.h2d_bytes`);
        with fixed slots every row of the batch, a masked one as a whole row."""
        sub = self.submodel
        nbytes = [b.nbytes for b in self.inputs.values()]
        if self.fixed_slots:
            idle_bytes = sum(n // sub.batch for n in nbytes) * (sub.batch - len(self.active))
            return h2d_bytes(nbytes, sub.batch, sub.max_tokens, self.active) + idle_bytes
        return h2d_bytes(nbytes, sub.batch, sub.max_tokens, self.rows)

    @property
    def output_bytes(self) -> int:
        """What D2H moves: the active rows of every output (`timing.d2h_bytes`); with fixed slots
        all B rows."""
        nbytes = [b.nbytes for b in self.outputs.values()]
        if self.fixed_slots:
            return sum(nbytes)
        return d2h_bytes(nbytes, self.submodel.batch, self.rows)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _lookup(
    names: Mapping[str, int],
    specs: tuple[TensorSpec, ...],
    buffers: Mapping[int, HostBuffer],
    kind: str,
    sub: str,
) -> dict[str, HostBuffer]:
    if not isinstance(names, Mapping):
        raise InvalidJob(f"submodel {sub!r}: job {kind} must map tensor names to buffer ids")
    wanted = sorted(s.name for s in specs)
    if sorted(names) != wanted:
        raise InvalidJob(f"submodel {sub!r}: job {kind} {sorted(names)} must be exactly {wanted}")
    out: dict[str, HostBuffer] = {}
    for spec in specs:
        buffer_id = names[spec.name]
        buf = buffers.get(buffer_id) if _is_int(buffer_id) else None
        if buf is None:
            raise InvalidJob(f"submodel {sub!r}: {kind[:-1]} {spec.name!r} names unknown buffer {buffer_id!r}")
        want_dtype = NUMPY_DTYPES[spec.dtype]
        arr = buf.array
        if arr.dtype != want_dtype or tuple(arr.shape) != tuple(spec.shape):
            raise InvalidJob(
                f"submodel {sub!r}: {spec.name!r} buffer {buffer_id} is {arr.dtype}{list(arr.shape)}, "
                f"expected {spec.dtype}{list(spec.shape)}"
            )
        out[spec.name] = buf
    return out


def _check_rows(
    rows: tuple[RowSpec, ...], sub: SubmodelInfo, lanes: int, context: int, caps: DeviceCapabilities
) -> None:
    if not 1 <= len(rows) <= sub.batch:
        raise InvalidJob(f"submodel {sub.name!r}: {len(rows)} rows; expected 1..{sub.batch}")
    for i, row in enumerate(rows):
        if not isinstance(row, RowSpec) or not all(_is_int(v) for v in (row.lane, row.past_kv_len, row.cur_seq_len)):
            raise InvalidJob(f"row {i}: expected a RowSpec of integers, got {row!r}")
    check_slot_rows(rows, sub, caps.lane_selection, caps.inactive_rows)
    fixed = not caps.lane_selection and slot_bound(sub)
    seen: set[int] = set()
    for i, row in enumerate(rows):
        if not 0 <= row.lane < lanes:
            raise InvalidJob(f"row {i}: lane {row.lane} out of range 0..{lanes - 1}")
        if row.lane in seen:
            raise InvalidJob(f"row {i}: lane {row.lane} appears twice in one job")
        seen.add(row.lane)
        if fixed and row.is_masked:  # checked by `check_slot_rows`: an idle slot of a fixed-slot job
            continue
        if row.past_kv_len < 0:
            raise InvalidJob(f"row {i}: past_kv_len {row.past_kv_len} is negative")
        if sub.task_type is TaskType.DECODE and row.cur_seq_len != 1:
            raise InvalidJob(f"row {i}: decode cur_seq_len must be 1, got {row.cur_seq_len}")
        if not 1 <= row.cur_seq_len <= sub.max_tokens:
            raise InvalidJob(f"row {i}: cur_seq_len {row.cur_seq_len} outside 1..{sub.max_tokens}")
        if row.past_kv_len + row.cur_seq_len > context:
            raise InvalidJob(
                f"row {i}: past_kv_len {row.past_kv_len} + cur_seq_len {row.cur_seq_len} exceeds "
                f"the lane context {context}"
            )


def resolve_job(
    job: JobSpec, model: ModelGeometry, buffers: Mapping[int, HostBuffer], caps: DeviceCapabilities
) -> ResolvedJob:
    """Check `job` completely and look its buffers up (`caps`: the device's lane selection and
    inactive-row rule).

    Raises:
        InvalidJob: unknown submodel or buffer; input/output names not exactly the submodel's;
            wrong dtype or shape; one buffer named twice; a read-only output; no rows or more
            rows than the batch; lane out of range or repeated; decode cur_seq_len != 1;
            prefill cur_seq_len outside 1..max_tokens; negative past_kv_len;
            past_kv_len + cur_seq_len above the lane context; without lane selection, a row
            off its slot or idle rows not masked as the rule says (`RowOffSlot`).
    """
    sub = model.submodels.get(job.submodel)
    if sub is None:
        raise InvalidJob(f"unknown submodel {job.submodel!r}; known: {sorted(model.submodels)}")
    inputs = _lookup(job.inputs, sub.inputs, buffers, "inputs", sub.name)
    outputs = _lookup(job.outputs, sub.outputs, buffers, "outputs", sub.name)
    ids = [b.buffer_id for b in (*inputs.values(), *outputs.values())]
    if len(set(ids)) != len(ids):
        raise InvalidJob(f"submodel {sub.name!r}: one buffer is named twice in the job ({ids})")
    for name, buf in outputs.items():
        if not buf.array.flags.writeable:
            raise InvalidJob(f"submodel {sub.name!r}: output {name!r} buffer {buf.buffer_id} is read-only")
    rows = tuple(job.rows)
    _check_rows(rows, sub, model.lanes, model.context[sub.name], caps)
    return ResolvedJob(sub, inputs, outputs, rows, fixed_slots=not caps.lane_selection and slot_bound(sub))
