"""`calculet-gateway --workers N`: N gateway processes serving one listening socket (docs/gateway.md,
"Workers"). `serve` runs the supervisor, `supervisor` keeps the workers running, `launcher` starts one,
`identity` is what a worker knows of itself and its siblings."""
