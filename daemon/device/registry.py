"""Find device drivers by name through the `calculet.devices` entry point group."""

from __future__ import annotations

from importlib.metadata import entry_points

from calculet.daemon.device.api import DeviceDriver
from calculet.daemon.device.errors import DeviceNotFound

GROUP = "calculet.devices"


def available_drivers() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=GROUP))


def load_driver(name: str) -> DeviceDriver:
    """Instantiate the driver registered as `name`.

    Raises:
        DeviceNotFound: no driver has that name.
    """
    matches = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not matches:
        raise DeviceNotFound(f"no device driver named {name!r}; available: {', '.join(available_drivers()) or 'none'}")
    driver_cls = matches[0].load()
    driver = driver_cls()
    if not isinstance(driver, DeviceDriver):
        raise DeviceNotFound(f"entry point {name!r} does not provide a DeviceDriver")
    return driver
