"""`calctl bench --workload multiturn`: conversations that come back (issue 19), measured through a
gateway's OpenAI chat API (docs/benchmarking.md, "Multi-turn conversations").

Data flow:

    flags (`flags`) -> MultiturnSpec -> the model's tokenizer (GetModel, or --tokenizer) ->
    `workload.build_workload`: one shared system prompt of S tokens and, per user, distinct user
    messages of U tokens (`text.sized_text`), think times and a start offset, all from the seed
    -> `run.run_multiturn`: warm-up chats, the boards' Status, then `conversation.run_conversations`
    (every user concurrently: turn k sends the system prompt, every earlier user message and
    streamed answer, and the new message, through `chat.ChatBackend`; `chat_sse` reads the stream)
    -> TurnRecord per request (RequestRecord + the answer text + usage's cached tokens)
    -> the common figures (`summary.summarize`, `device_stats`) and the per-turn ones
    (`per_turn.turn_stats`, `model_cost` against the timing model, `targets`)
    -> `report.multiturn_json` (the report's `multiturn` section), `table` (rich), `plot`.

Everything runs on one asyncio loop; times are `time.perf_counter()` seconds, as in the rest of
`calculet.ops.bench`.
"""
