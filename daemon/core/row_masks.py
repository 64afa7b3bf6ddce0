"""The constrained rows' next-token masks of one device job (docs/daemon.md "Constrained decoding").

Computed by `completion.prepare_masks` while the device runs the job, held by its `DeviceJob`, read
when it is sampled; plain data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RowMasks:
    """Per row of a device job, in row order.

    Attributes:
        allowed: bool [vocab] of the tokens the row's constraint allows next; None for an
            unconstrained row (or one whose matcher failed).
        failed: why a constrained row's matcher allows no token (None: it does, or no constraint).
    """

    allowed: tuple[np.ndarray | None, ...]
    failed: tuple[str | None, ...]
