"""`calculet.daemon`: the per-board daemon (docs/daemon.md).

Layers, from the board up: `device` (the contract) and `calsim` (the emulator behind it);
`package` (manifest, validator, capacity); `sampling`; `core` (DeviceCore: engine, scheduler,
executor, KV lanes, job buffers, model lifecycle, status views); `wire` / `wire_views` (the only
protobuf conversions); `server` (the gRPC transport); `main` (the `calculet-daemon` command).
"""
