"""`calculet.gateway`: the OpenAI-compatible HTTP gateway in front of many board daemons
(docs/gateway.md).

Layers, from the wire up: `fleet/` (one `DaemonConnection` per daemon through `calculet.client`,
`Board` state from WatchLoad and grpc.health Watch, `Discovery` from a static list and DNS,
`Router`), `text/` (tokenizer and chat template from GetModel, incremental detokenizer, stop
strings), `serving/` (`ChoiceRunner`: one choice with retry and mid-stream failover;
`GatewayService`: a request from parsed body to choice events), `api/` (schemas, OpenAI response
formats, SSE, the FastAPI app), `errors` (the one ErrorKind -> HTTP mapping), `config`, `main`.
"""
