"""The OpenAI-compatible HTTP surface: request schemas, response builders, SSE, the FastAPI app.
Routes only parse, call `GatewayService` and format; they make no decisions."""
