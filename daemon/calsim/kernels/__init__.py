"""calsim compute kernels: numeric (tiny Qwen3-MoE in numpy) and synthetic (any geometry)."""
