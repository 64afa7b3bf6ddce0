"""Fixtures for the calsim kernel tests (the factories live in kernel_factories.py)."""

from .kernel_factories import kernel_maker, tiny_package

__all__ = ["kernel_maker", "tiny_package"]
