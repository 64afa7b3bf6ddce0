"""calculet.v1: generated wire protocol."""
