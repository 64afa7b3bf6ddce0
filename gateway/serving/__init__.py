"""Serving requests over the fleet: one resilient choice (`choice.py`), the request as a whole
(`service.py`). Plain asyncio code: no HTTP, no gRPC."""
