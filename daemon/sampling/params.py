"""Per-request sampling parameters and their validation.

`SamplingParams` is the domain form of a request's sampling settings (the gateway and the wire
module build it; the daemon stores it with the generation; the `Sampler` reads it every step).
Constructing one checks every field on its own; `validate(vocab_size)` repeats those checks and
adds the ones that need the model (top_k <= vocab). Every refusal is an `InvalidArgument` whose
message starts with the field name.

Semantics (order of application in the sampler: penalties -> temperature -> top-k -> top-p ->
min-p -> draw; see `calculet.daemon.sampling.row`):
- temperature: logits are divided by it; below `GREEDY_TEMPERATURE` (0 included) the row is
  greedy (argmax, lowest id on ties), as vLLM does.
- top_k: keep the k most likely tokens (ties broken by lower token id); 0 = off.
- top_p: keep the smallest most-likely-first prefix whose probability reaches top_p; 1 = off.
- min_p: drop tokens whose probability is below min_p times the most likely one's; 0 = off.
- repetition_penalty: HF/vLLM; for tokens seen in prompt or output, positive logits are divided
  by it and negative ones multiplied; 1 = off.
- presence_penalty / frequency_penalty: OpenAI; over generated tokens only, subtract
  `presence` once per distinct token and `frequency * count`.
- logprobs: None = none; 0 = the chosen token's logprob; N (1..20) = that plus the N most likely.
- seed: keys the counter-based RNG with the step index; a request without a seed should be
  given a random one by whoever admits it, and keep it across retries and failover.
- constraint: None, or what the output must match (`constraint.py`); the row is then sampled from
  its masked logits (`masked.py`: penalties -> mask -> temperature -> ...).
- thinking: None, or a thinking budget (`thinking.py`): after that many tokens in a think block the
  close token is forced; a constraint then applies to the answer after the block only.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from calculet.common.errors import InvalidArgument
from calculet.daemon.sampling.constraint import Constraint
from calculet.daemon.sampling.thinking import ThinkingBudget

MAX_SEED = 2**64 - 1
MAX_LOGPROBS = 20
MAX_TEMPERATURE = 1.0e6  # beyond this the distribution is uniform for any practical logits
GREEDY_TEMPERATURE = 1.0e-5  # temperatures below this sample greedily (vLLM's _SAMPLING_EPS)
PENALTY_LIMIT = 2.0  # presence/frequency penalties live in [-2, 2] (OpenAI)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request draws its tokens (immutable; shared freely between threads).

    Raises (on construction):
        InvalidArgument: a field is out of range, not finite, or of the wrong type.
    """

    seed: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    constraint: Constraint | None = None
    thinking: ThinkingBudget | None = None

    def __post_init__(self) -> None:
        self._check_fields()

    @property
    def greedy(self) -> bool:
        """The row takes the argmax of the penalised logits instead of a random draw."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def validate(self, vocab_size: int) -> None:
        """Check every field, including those that depend on the model.

        Args:
            vocab_size: the serving model's vocabulary size (> 0).

        Raises:
            InvalidArgument: a field is invalid; the message names it.
        """
        self._check_fields()
        if self.top_k > vocab_size:
            raise InvalidArgument(f"top_k: must be at most the vocabulary size {vocab_size}, got {self.top_k}")
        if self.thinking is not None:
            self.thinking.validate(vocab_size)

    def _check_fields(self) -> None:
        _integer("seed", self.seed, 0, MAX_SEED)
        t = _real("temperature", self.temperature)
        if not 0.0 <= t <= MAX_TEMPERATURE:
            raise InvalidArgument(f"temperature: must be in [0, {MAX_TEMPERATURE:g}], got {t}")
        _integer("top_k", self.top_k, 0, None)
        p = _real("top_p", self.top_p)
        if not 0.0 < p <= 1.0:
            raise InvalidArgument(f"top_p: must be in (0, 1], got {p}")
        mp = _real("min_p", self.min_p)
        if not 0.0 <= mp < 1.0:
            raise InvalidArgument(f"min_p: must be in [0, 1), got {mp}")
        rp = _real("repetition_penalty", self.repetition_penalty)
        if rp <= 0.0:
            raise InvalidArgument(f"repetition_penalty: must be > 0, got {rp}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = _real(name, getattr(self, name))
            if not -PENALTY_LIMIT <= v <= PENALTY_LIMIT:
                raise InvalidArgument(f"{name}: must be in [-{PENALTY_LIMIT:g}, {PENALTY_LIMIT:g}], got {v}")
        if self.logprobs is not None:
            _integer("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise InvalidArgument(f"constraint: must be a Constraint, got {self.constraint!r}")
        if self.thinking is not None and not isinstance(self.thinking, ThinkingBudget):
            raise InvalidArgument(f"thinking: must be a ThinkingBudget, got {self.thinking!r}")


def _integer(name: str, value: object, low: int, high: int | None) -> int:
    # bool is an int subclass; `top_k=True` is a caller bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{name}: must be an integer, got {value!r}")
    v = int(value)
    if v < low or (high is not None and v > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidArgument(f"{name}: must be {bound}, got {v}")
    return v


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{name}: must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise InvalidArgument(f"{name}: must be finite, got {v}")
    return v
