"""Tests of `calctl package build-sim` and `calculet.ops.sim_packages`."""
