"""`calculet.v1`: the daemon's wire protocol, generated from the `.proto` files beside this file
(`make protos` regenerates; tests/unit/test_protos.py fails on any difference)."""
