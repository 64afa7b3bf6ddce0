"""What the sampler takes per row and what it gives back (value types, no behaviour).

Ownership: a `RowSampling` is built by the daemon for one row of one device job and only read by
the sampler during `sample()`; its `history` stays owned by the generation. A `RowResult` holds
plain Python values, no views into sampler workspace, so it outlives the call freely.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from calculet.common.errors import InvalidArgument
from calculet.daemon.sampling.history import TokenHistory
from calculet.daemon.sampling.params import SamplingParams


@dataclass(frozen=True, slots=True)
class RowSampling:
    """How to sample one row of a logits batch.

    Attributes:
        params: the request's sampling parameters (validated).
        step: how many completion tokens the request has already (resumed ones included); the
            RNG counter of the token being drawn now.
        history: the generation's token history; required when `params` has penalties.
        allowed: bool [vocab], the tokens the request's constraint allows now (None: unconstrained);
            the row is sampled from its masked logits (`masked.py`). Owned by the caller, read
            only during `sample()`.

    Raises (on construction):
        InvalidArgument: `step` is not an integer in [0, 2^64).
    """

    params: SamplingParams
    step: int
    history: TokenHistory | None = None
    allowed: np.ndarray | None = None

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, numbers.Integral) or not 0 <= self.step < 2**64:
            raise InvalidArgument(f"step: must be an integer in [0, 2^64), got {self.step!r}")


@dataclass(frozen=True, slots=True)
class RowResult:
    """The outcome of one row.

    Attributes:
        token: the drawn token id; None when `anomaly` is set.
        logprob: the token's log-probability when `params.logprobs` is not None, else None.
        top_logprobs: the `params.logprobs` most likely `(token, logprob)`, most likely first
            (ties: lower id first); empty unless requested.
        anomaly: the row's logits held NaN or +-Inf; no token was drawn and the daemon must
            quarantine the model generation (docs/daemon.md, reset controller).
    """

    token: int | None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    anomaly: bool = False


ANOMALY = RowResult(token=None, anomaly=True)
