"""`calculet.gateway`: the OpenAI-compatible HTTP gateway in front of many board daemons
(DESIGN.md section 7). Not built yet: only the `calculet-gateway` entry point exists, and it says so."""
