"""Typed device errors. Every device call returns or raises one of these; none aborts.

Each error carries the domain `ErrorKind` the daemon reports if the error reaches a caller
unchanged (most are handled by the executor and reset controller first).
"""

from __future__ import annotations

from calculet.common.errors import CalculetError, ErrorKind


class DeviceError(CalculetError):
    """Base of all device-contract errors."""

    kind = ErrorKind.UNAVAILABLE


class DeviceNotFound(DeviceError):
    """No driver is registered under the requested name, or the board index does not exist."""

    kind = ErrorKind.NOT_FOUND


class DeviceBusy(DeviceError):
    """Another process holds the board: its runtime lets one process open a device at a time. The
    message names the holder when the driver can tell (calsim: its pid and lock file)."""

    kind = ErrorKind.FAILED_PRECONDITION


class DeviceLost(DeviceError):
    """The device stopped answering; every later call raises this until the process restarts."""


class ConfigurationError(DeviceError):
    """The package cannot be configured (bad files, unsupported submodel, runtime mismatch)."""

    kind = ErrorKind.FAILED_PRECONDITION


class OutOfDeviceMemory(ConfigurationError):
    """Configuring the package would exceed a chip's DRAM or SRAM."""


class TooManyConfigurations(ConfigurationError):
    """The device already holds its maximum number of configured models."""


class InvalidJob(DeviceError):
    """The job is malformed: unknown submodel/buffer, wrong shape or dtype, bad rows or CSR values.
    Nothing was submitted."""

    kind = ErrorKind.INVALID_ARGUMENT


class StaleKV(InvalidJob):
    """A row's `past_kv_len` exceeds what its lane validly holds: the daemon trusts KV the device
    freed, cleared, corrupted or never wrote (a lane closed by KV Free, a configuration reset, a
    job that ended CCU_EXCEPTION). Nothing was submitted. A daemon bug, raised loudly rather than
    computing on poison."""


class RowOffSlot(InvalidJob):
    """A job for a device without lane selection breaks its fixed slots: a row names a KV lane that
    is not its row index, or its idle rows are not masked as the device's `inactive_rows` rule says
    (`slots.py`). Nothing was submitted: on such a board the row would attend over another
    sequence's KV."""


class EngineBusy(DeviceError):
    """The requested engine bank (or, for AUTO, every bank) already has a job in flight."""

    kind = ErrorKind.OVERLOADED


class BufferInUse(DeviceError):
    """A host buffer named by the job is still held by an in-flight job."""

    kind = ErrorKind.FAILED_PRECONDITION


class LaneBusy(DeviceError):
    """A KV lane named by the job is already being advanced by an in-flight job."""

    kind = ErrorKind.FAILED_PRECONDITION


class OutOfKV(DeviceError):
    """The device has no KV space for another lane (CalRT KV Apply refused; it would loop forever
    in `do {} while (!Apply())`). Nothing changed: retry later or elsewhere."""

    kind = ErrorKind.OVERLOADED


class SubmitFailed(DeviceError):
    """The runtime rejected the submission (the `infer()` return code). Nothing runs; the
    job's buffers and lanes are not held."""


class WaitTimeout(DeviceError):
    """`wait(timeout)` elapsed before the job finished. The job may still run: its buffers stay
    held until it finishes or the device is reset."""

    kind = ErrorKind.DEADLINE_EXCEEDED


class ModelReleased(DeviceError):
    """The configured model was released or reset; its handle can no longer be used."""

    kind = ErrorKind.FAILED_PRECONDITION
