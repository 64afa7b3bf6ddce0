"""The device contract (docs/vendor-binding.md): ABCs, value types and typed errors.

Implementations: `calculet.daemon.calsim` (the embedded emulator) and vendor bindings, all
registered under the entry point group `calculet.devices`.
"""

from calculet.daemon.device.api import (
    ConfiguredModel,
    DeviceDriver,
    HostBuffer,
    Submission,
    VirtualDevice,
)
from calculet.daemon.device.errors import (
    BufferInUse,
    ConfigurationError,
    DeviceBusy,
    DeviceError,
    DeviceLost,
    DeviceNotFound,
    EngineBusy,
    InvalidJob,
    LaneBusy,
    ModelReleased,
    OutOfDeviceMemory,
    SubmitFailed,
    TooManyConfigurations,
    WaitTimeout,
)
from calculet.daemon.device.registry import available_drivers, load_driver
from calculet.daemon.device.types import (
    ChipInfo,
    ChipMemory,
    DeviceCapabilities,
    DeviceInfo,
    EngineSlot,
    JobCounters,
    JobSpec,
    JobStatus,
    JobTimestamps,
    MemoryUsage,
    RowSpec,
    SubmodelInfo,
    TaskType,
    TensorSpec,
)

__all__ = [
    "BufferInUse",
    "ChipInfo",
    "ChipMemory",
    "ConfigurationError",
    "ConfiguredModel",
    "DeviceBusy",
    "DeviceCapabilities",
    "DeviceDriver",
    "DeviceError",
    "DeviceInfo",
    "DeviceLost",
    "DeviceNotFound",
    "EngineBusy",
    "EngineSlot",
    "HostBuffer",
    "InvalidJob",
    "JobCounters",
    "JobSpec",
    "JobStatus",
    "JobTimestamps",
    "LaneBusy",
    "MemoryUsage",
    "ModelReleased",
    "OutOfDeviceMemory",
    "RowSpec",
    "Submission",
    "SubmitFailed",
    "SubmodelInfo",
    "TaskType",
    "TensorSpec",
    "TooManyConfigurations",
    "VirtualDevice",
    "WaitTimeout",
    "available_drivers",
    "load_driver",
]
