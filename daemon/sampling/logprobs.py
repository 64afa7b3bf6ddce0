"""Log-probabilities reported with a token: the chosen token's and the top-N alternatives.

What they are computed from (one definition for every path): the log-softmax over the WHOLE
vocabulary of the processed logits `z = (x - max(x)) * (1/T)`, where `x` are the logits after
penalties and T is the row's temperature (T = 1 for greedy rows). Truncation (top-k, top-p,
min-p) does not renormalise them: they are vLLM's "processed logprobs", so a token outside the
nucleus still has its true, finite logprob.

Data flow: the row finisher passes the row, its max, T, and the log of the full mass it already
computed (`FullMass.total`); top-N is the source's exact `top_k` (`source.py`).
"""

from __future__ import annotations

import numpy as np

from calculet.daemon.sampling.select import rank_order
from calculet.daemon.sampling.source import RowSource


def scaled(
    vals: np.ndarray, row_max: np.float32, inv_temperature: np.float32, out: np.ndarray | None = None
) -> np.ndarray:
    """`(vals - row_max) * inv_temperature` in float32 (<= 0, never NaN); the one formula every path uses.

    Multiplying by the float32 reciprocal of T is the definition (it is cheaper than dividing)."""
    return divide_by_temperature(np.subtract(vals, row_max, out=out), inv_temperature)


def divide_by_temperature(z: np.ndarray, inv_temperature: np.float32) -> np.ndarray:
    """`z * inv_temperature` in place (skipped at T = 1, where it is the identity); returns `z`."""
    if inv_temperature != 1.0:
        np.multiply(z, inv_temperature, out=z)
    return z


def token_logprob(x_token: np.float32, row_max: np.float32, inv_temperature: np.float32, log_total: float) -> float:
    """Logprob of one token whose penalised logit is `x_token`."""
    z = scaled(np.asarray([x_token], dtype=np.float32), row_max, inv_temperature)
    return float(z[0]) - log_total


def top_logprobs(
    src: RowSource, n: int, row_max: np.float32, inv_temperature: np.float32, log_total: float
) -> tuple[tuple[int, float], ...]:
    """The n most likely `(token, logprob)`, most likely first, ties by lower id (fewer when a
    constrained row allows fewer than n tokens).

    Args:
        src: the row's penalised logits.
        n: how many (>= 1); at most the vocabulary size are returned.
        row_max / inv_temperature / log_total: as for `token_logprob`.
    """
    ids, vals = src.top_k(n)
    order = rank_order(ids, vals)
    z = scaled(vals[order], row_max, inv_temperature).astype(np.float64) - log_total
    finite = np.isfinite(z)  # a constrained row's forbidden tokens (-inf) are not alternatives
    return tuple(zip(ids[order][finite].tolist(), z[finite].tolist(), strict=True))
