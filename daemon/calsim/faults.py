"""calsim fault plan: which submit attempt gets which injected fault.

Data flow: the device numbers every `submit` call (0-based, counting every attempt, refused
ones included) and asks `FaultPlan.select(index)` once per attempt; the engine then acts out the
returned fault. A fault selected for an attempt that is refused before acceptance (InvalidJob,
EngineBusy, BufferInUse, LaneBusy, ModelReleased) is dropped, never carried over. The plan comes
from option `fault_plan` (a JSON file path or the same structure as a dict) and grows at run time
through `CalsimDevice.inject` (the ops RPC).

File format (JSON object):

    {
      "seed": 7,                                   # optional int, default 0
      "faults": [
        {"kind": "ccu_exception", "job": 3},       # exactly at submit attempt 3
        {"kind": "slow_job", "job": 5, "delay_ms": 250.0},
        {"kind": "nan_logits", "probability": 0.01},
        {"kind": "device_lost", "job": 100}
      ]
    }

Kinds: `submit_error` (submit raises SubmitFailed, nothing held), `ccu_exception` (job ends
CCU_EXCEPTION at the end of its compute, outputs not written, its lanes corrupted), `hang` (job
never finishes until reset_ccu / reset_configuration, then CCU_EXCEPTION), `nan_logits` (every
logit of every active row is NaN; KV is written normally), `slow_job` (`delay_ms` of extra
modelled time before H2D; required for this kind and only for it), `device_lost` (this and every
later call raises DeviceLost).

Each entry names exactly one of `job` (attempt index >= 0; at most one entry per index) or
`probability` (0..1; the probabilities add up to at most 1). An index entry wins over the
probabilistic ones. The probabilistic draw for attempt i is `uniform(seed, i)` from a
counter-based generator, compared with the cumulative probabilities in file order, so the same
plan selects the same attempts whatever the timing or threads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from calculet.daemon.device.errors import InvalidJob


class FaultKind(Enum):
    SUBMIT_ERROR = "submit_error"
    CCU_EXCEPTION = "ccu_exception"
    HANG = "hang"
    NAN_LOGITS = "nan_logits"
    SLOW_JOB = "slow_job"
    DEVICE_LOST = "device_lost"


_ENTRY_KEYS = frozenset({"kind", "job", "probability", "delay_ms"})


@dataclass(frozen=True)
class Fault:
    """One planned fault.

    Attributes:
        kind: what happens.
        job: submit attempt index it fires at; None with `probability`, or (for `inject`) None
            with no probability to mean "the next submit attempt".
        probability: chance per attempt, drawn from the plan's seed.
        delay_ms: extra modelled delay before H2D (SLOW_JOB only, > 0).

    Raises:
        InvalidJob: inconsistent fields (both job and probability, negative index, probability
            outside 0..1, delay on a kind other than SLOW_JOB or missing on SLOW_JOB).
    """

    kind: FaultKind
    job: int | None = None
    probability: float | None = None
    delay_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.job is not None and self.probability is not None:
            raise InvalidJob(f"fault {self.kind.value}: give either 'job' or 'probability', not both")
        if self.job is not None and (isinstance(self.job, bool) or self.job < 0):
            raise InvalidJob(f"fault {self.kind.value}: job index must be an integer >= 0, got {self.job!r}")
        if self.probability is not None and not 0.0 <= self.probability <= 1.0:
            raise InvalidJob(f"fault {self.kind.value}: probability must be in 0..1, got {self.probability!r}")
        if self.kind is FaultKind.SLOW_JOB:
            if not (math.isfinite(self.delay_ms) and self.delay_ms > 0):
                raise InvalidJob(f"fault slow_job: delay_ms must be a finite number > 0, got {self.delay_ms!r}")
        elif self.delay_ms != 0.0:
            raise InvalidJob(f"fault {self.kind.value}: delay_ms applies to slow_job only")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value}
        if self.job is not None:
            out["job"] = self.job
        if self.probability is not None:
            out["probability"] = self.probability
        if self.kind is FaultKind.SLOW_JOB:
            out["delay_ms"] = self.delay_ms
        return out

    @classmethod
    def from_dict(cls, raw: Any, where: str = "fault") -> Fault:
        """Parse one plan entry.

        Raises:
            InvalidJob: unknown key or kind, wrong type, or inconsistent fields.
        """
        if not isinstance(raw, Mapping):
            raise InvalidJob(f"{where}: expected an object")
        unknown = sorted(set(raw) - _ENTRY_KEYS)
        if unknown:
            raise InvalidJob(f"{where}: unknown keys {unknown}")
        try:
            kind = FaultKind(raw.get("kind"))
        except ValueError:
            known = ", ".join(k.value for k in FaultKind)
            raise InvalidJob(f"{where}.kind: {raw.get('kind')!r} is not one of {known}") from None
        job = raw.get("job")
        if job is not None and (isinstance(job, bool) or not isinstance(job, int)):
            raise InvalidJob(f"{where}.job: expected an integer, got {job!r}")
        probability = _number(raw, "probability", where)
        delay = _number(raw, "delay_ms", where)
        if job is None and probability is None:
            raise InvalidJob(f"{where}: give 'job' (attempt index) or 'probability'")
        return cls(kind, job, probability, 0.0 if delay is None else delay)


def _number(raw: Mapping[str, Any], key: str, where: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJob(f"{where}.{key}: expected a number, got {value!r}")
    return float(value)


class FaultPlan:
    """Index-selected and probability-selected faults, plus the seed of the draws.

    Not thread-safe: the device calls it under its lock.

    Args:
        faults: planned faults (each with `job` or `probability`).
        seed: seed of the per-attempt probabilistic draw.

    Raises:
        InvalidJob: two faults at the same index, a fault with neither index nor probability,
            or probabilities adding up to more than 1.
    """

    def __init__(self, faults: Iterable[Fault] = (), seed: int = 0) -> None:
        self.seed = seed
        self._by_index: dict[int, Fault] = {}
        self._random: list[Fault] = []
        for fault in faults:
            self._add(fault)

    def _add(self, fault: Fault) -> None:
        if fault.job is not None:
            if fault.job in self._by_index:
                raise InvalidJob(f"fault plan: two faults at job {fault.job}")
            self._by_index[fault.job] = fault
        elif fault.probability is not None:
            total = sum(f.probability or 0.0 for f in self._random) + fault.probability
            if total > 1.0 + 1e-12:
                raise InvalidJob(f"fault plan: probabilities add up to {total:.6g} > 1")
            self._random.append(fault)
        else:
            raise InvalidJob(f"fault {fault.kind.value}: needs a job index or a probability")

    def inject(self, fault: Fault, next_index: int) -> Fault:
        """Add a fault at run time; a fault with neither index nor probability targets
        `next_index` (the next submit attempt).

        Returns:
            The fault as planned (with its index filled in).

        Raises:
            InvalidJob: the index is already past (< next_index) or already has a fault, or
                probabilities would exceed 1.
        """
        if fault.job is None and fault.probability is None:
            fault = Fault(fault.kind, next_index, None, fault.delay_ms)
        if fault.job is not None and fault.job < next_index:
            raise InvalidJob(f"fault {fault.kind.value}: job {fault.job} already submitted (next is {next_index})")
        self._add(fault)
        return fault

    def clear(self) -> None:
        """Forget every planned fault (from the file and from `inject`); the seed stays."""
        self._by_index.clear()
        self._random.clear()

    def select(self, index: int) -> Fault | None:
        """The fault for submit attempt `index`, or None."""
        hit = self._by_index.get(index)
        if hit is not None or not self._random:
            return hit
        draw = float(np.random.default_rng([self.seed, index]).random())
        edge = 0.0
        for fault in self._random:
            edge += fault.probability or 0.0
            if draw < edge:
                return fault
        return None

    def faults(self) -> list[Fault]:
        return [self._by_index[i] for i in sorted(self._by_index)] + list(self._random)

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "faults": [f.to_dict() for f in self.faults()]}

    @classmethod
    def from_dict(cls, raw: Any, where: str = "fault_plan") -> FaultPlan:
        """Parse the JSON structure described in the module docstring.

        Raises:
            InvalidJob: wrong structure or inconsistent faults.
        """
        if not isinstance(raw, Mapping):
            raise InvalidJob(f"{where}: expected an object with 'faults' (and optional 'seed')")
        unknown = sorted(set(raw) - {"seed", "faults"})
        if unknown:
            raise InvalidJob(f"{where}: unknown keys {unknown}")
        seed = raw.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidJob(f"{where}.seed: expected an integer >= 0, got {seed!r}")
        entries = raw.get("faults", [])
        if not isinstance(entries, list):
            raise InvalidJob(f"{where}.faults: expected a list")
        return cls((Fault.from_dict(e, f"{where}.faults[{i}]") for i, e in enumerate(entries)), seed)

    @classmethod
    def load(cls, source: str | Path | Mapping[str, Any] | None) -> FaultPlan:
        """A plan from option `fault_plan`: None (empty plan), a dict, or a JSON file path.

        Raises:
            InvalidJob: unreadable file, invalid JSON, or a malformed plan.
        """
        if source is None:
            return cls()
        if isinstance(source, Mapping):
            return cls.from_dict(source)
        if not isinstance(source, str | Path):
            raise InvalidJob(f"fault_plan: expected a path or an object, got {type(source).__name__}")
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidJob(f"fault_plan {path}: cannot read: {exc.strerror}") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidJob(f"fault_plan {path}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
        return cls.from_dict(raw, f"fault_plan {path}")
