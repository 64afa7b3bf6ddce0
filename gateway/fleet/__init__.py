"""The fleet of board daemons behind the gateway: connections, per-board state fed by WatchLoad and
grpc.health Watch, discovery (static list + DNS), and the router that picks a board per request."""
