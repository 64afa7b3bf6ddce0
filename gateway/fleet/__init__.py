"""The fleet of board daemons behind the gateway (membership): connections, per-board state fed by
WatchLoad and grpc.health Watch, discovery (static list + DNS), the packages each board serves and
the model catalog. Routing a request to a board is `gateway/routing/`; choosing which model a board
serves is `gateway/placement/`."""
