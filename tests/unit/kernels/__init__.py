"""Tests of the calsim compute kernels (numeric and synthetic)."""
