"""The model's own tokenizer as a `TokenCounter`, for sizing the multi-turn workload's texts.

From `--tokenizer FILE` (a `tokenizer.json`) or from the bytes a daemon's GetModel returns
(`ModelInfo.tokenizer_json`, the package's file byte for byte, as the gateway loads it). Texts are
counted as `Tokenizer.encode(text, add_special_tokens=False)` counts them: the message content
alone, without the chat template's role markers (those the report's usage counts include).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from calculet.common.errors import FailedPrecondition, InvalidArgument
from calculet.ops.bench.multiturn.text import TokenCounter


def counter_from_json(data: bytes, where: str) -> TokenCounter:
    """A counter from `tokenizer.json` bytes (`where` names their source in errors).

    Raises:
        FailedPrecondition: the bytes are not a tokenizer the `tokenizers` library loads.
    """
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as err:  # the Rust side raises plain Exceptions (and bad UTF-8 a UnicodeDecodeError)
        raise FailedPrecondition(f"{where}: not a tokenizer.json the tokenizers library loads: {err}") from None

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count


def counter_from_file(path: Path) -> TokenCounter:
    """Raises: InvalidArgument: the file cannot be read; FailedPrecondition: it is no tokenizer."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InvalidArgument(f"--tokenizer {path}: cannot be read: {err.strerror or err}") from None
    return counter_from_json(data, f"--tokenizer {path}")
