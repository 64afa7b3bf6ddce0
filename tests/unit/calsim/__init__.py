"""Unit tests of calsim's device implementation (engine, clock, faults, memory)."""
