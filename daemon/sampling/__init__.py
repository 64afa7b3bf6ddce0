"""Near-device sampling for the daemon (docs/daemon.md, Sampler and Determinism).

Public API: `SamplingParams` (params.py), `TokenHistory` (history.py), `RowSampling` /
`RowResult` (types.py), `Sampler` / `SamplingPolicy` (sampler.py), `uniform` (rng.py).
Order of operations and the logprob definition: row.py and logprobs.py.
"""

from calculet.daemon.sampling.history import TokenHistory
from calculet.daemon.sampling.params import SamplingParams
from calculet.daemon.sampling.rng import uniform
from calculet.daemon.sampling.sampler import Sampler, SamplingPolicy
from calculet.daemon.sampling.types import RowResult, RowSampling

__all__ = [
    "RowResult",
    "RowSampling",
    "Sampler",
    "SamplingParams",
    "SamplingPolicy",
    "TokenHistory",
    "uniform",
]
