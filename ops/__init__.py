"""`calculet.ops`: operator tooling — `calctl` and its commands, the calsim package builder,
protobuf generation, and `make run` (`run_local`)."""
