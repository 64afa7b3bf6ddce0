"""How many tokens one prefill job carries: the chunk size of chunked prefill (docs/sources.md 000 §6).

A prefill holds the device's one compute unit for its whole length, so a long prompt would stall
every running stream (7.7 s for 1,600 tokens on the qwen preset). Chunked, it runs as a sequence of
prefill jobs at growing offsets (`past_kv_len` = the chunk's offset, the mechanism prefix reuse uses
too), and the decode steps of the running streams interleave between them: a stream waits at most
one chunk.

The default (`CHUNK_AUTO`) comes from the package's declared timing: the smallest multiple of the
64-token block whose prefill costs at least `AUTO_DECODE_STEPS` decode steps of the largest decode
batch at a short context, capped by the prefill bucket. Smaller chunks cut the streams' worst gap but
pay the prefill's fixed cost once per chunk; at 4 steps that overhead stays near a tenth of a chunk.
On the qwen preset (decode batch 16: 42.9 ms a step; prefill 17.2 ms + 4.79 ms a token) 4 steps are
171.7 ms, reached at 33 tokens, so a chunk is 64 tokens (324 ms); the streams then get a token about
every 0.37 s while a long prompt prefills, instead of nothing for its whole length.
"""

from __future__ import annotations

from calculet.common.errors import InvalidArgument
from calculet.common.prefix import BLOCK_TOKENS
from calculet.daemon.package.manifest import TimingDecl

CHUNK_AUTO = 0
"""Setting: derive the chunk from the package's timing."""
CHUNK_OFF = -1
"""Setting: no chunking; a prefill is one job (prompts are limited to the prefill bucket)."""
AUTO_DECODE_STEPS = 4


def parse_chunk_setting(text: str) -> int:
    """`auto`, `on` (auto, forced: `chunk_forced`), `off` or a positive token count, as
    `--prefill-chunk-tokens` takes it.

    Raises:
        InvalidArgument: anything else.
    """
    value = text.strip().lower()
    if value in ("auto", "on"):
        return CHUNK_AUTO
    if value == "off":
        return CHUNK_OFF
    try:
        tokens = int(value)
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise InvalidArgument(f"prefill_chunk_tokens: 'auto', 'on', 'off' or a positive number of tokens, got {text!r}")
    return tokens


def chunk_forced(text: str) -> bool:
    """Whether a `--prefill-chunk-tokens` value forces chunking on (`on` or a number): a package whose
    prefill is not proven to run at an offset then fails to load (`prefill_offset.py`)."""
    value = text.strip().lower()
    return value not in ("auto", "off")


def auto_chunk_tokens(timing: TimingDecl, decode_batch: int) -> int:
    """The chunk whose prefill costs about `AUTO_DECODE_STEPS` decode steps (see the module docstring)."""
    step_ms = timing.decode_curve[0].ms_per_token * (1.0 + timing.batch_alpha * (decode_batch - 1))
    budget_ms = AUTO_DECODE_STEPS * step_ms - timing.prefill_fixed_ms
    per_token = max(timing.prefill_ms_per_token, 1e-9)
    tokens = max(1, -(-budget_ms // per_token)) if budget_ms > 0 else 1
    return int(-(-tokens // BLOCK_TOKENS) * BLOCK_TOKENS)


def chunk_tokens(setting: int, timing: TimingDecl, prefill_bucket: int, decode_batch: int) -> int:
    """Tokens one prefill job of this model carries.

    Args:
        setting: `CHUNK_AUTO`, `CHUNK_OFF` or a token count (>= 1).
        timing: the package's declared timing.
        prefill_bucket: the prefill submodel's largest input (a job never carries more).
        decode_batch: the largest decode batch (the step the running streams wait for).
    """
    if setting == CHUNK_OFF:
        return prefill_bucket
    wanted = auto_chunk_tokens(timing, decode_batch) if setting == CHUNK_AUTO else setting
    return max(1, min(wanted, prefill_bucket))
