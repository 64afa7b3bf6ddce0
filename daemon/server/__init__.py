"""The daemon's gRPC transport: a thin servicer over `DeviceCore`, the error mapping, the server."""
