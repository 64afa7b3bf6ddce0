"""Typed errors of the calsim compute kernels.

Both classes are also `ValueError`s because the `Kernel` contract (calsim/kernel.py) promises
ValueError to its callers; the `CalculetError` side carries the `ErrorKind` the daemon reports.
"""

from __future__ import annotations

from calculet.daemon.device.errors import ConfigurationError, InvalidJob


class KernelInputError(InvalidJob, ValueError):
    """A prefill/decode call is malformed (lane, lengths, tokens or positions). Nothing was written."""


class KernelConfigError(ConfigurationError, ValueError):
    """The package cannot back this kernel: geometry unsupported, weight files missing or inconsistent."""
