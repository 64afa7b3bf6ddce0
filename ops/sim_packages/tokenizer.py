"""A package's tokenizer, the `tiny` preset's byte-level BPE trained at build time, and the files.

Owns `TrainedTokenizer` (what every preset hands the package writer), training the tiny BPE
(Hugging Face `tokenizers`: ByteLevel pre-tokenizer and decoder, `BpeTrainer` over the built-in
corpus, all 256 bytes in the alphabet so every string encodes) and the two tokenizer files a
package ships: `tokenizer.json` and `tokenizer_config.json` (Qwen-style: added tokens, EOS,
`model_max_length`). Data flow: `train_tokenizer()` (tiny) or `build_qwen3_tokenizer()` (qwen,
`qwen3_tokenizer.py`) -> `TrainedTokenizer` -> `tokenizer_json()` / `tokenizer_config()` -> the
package writer. Training is deterministic: the same corpus gives byte-identical files.

Token ids at or above the tokenizer's vocabulary (the qwen model's vocab is 151,936, its
tokenizer's 151,669) are unknown to the tokenizer and decode to nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from calculet.ops.sim_packages.corpus import CORPUS

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)
TARGET_VOCAB_SIZE = 512


@dataclass(frozen=True)
class TrainedTokenizer:
    """A package's tokenizer and the ids of its added tokens.

    Attributes:
        tokenizer: the `tokenizers.Tokenizer`; the builder owns it, nothing mutates it after training.
        special_ids: added token text -> id (at least `SPECIAL_TOKENS`).
        additional_special_tokens: `tokenizer_config.json`'s `additional_special_tokens`.
        pretty_json: indent `tokenizer.json` (the qwen file is compact: 151K merges).
    """

    tokenizer: Tokenizer
    special_ids: dict[str, int]
    additional_special_tokens: tuple[str, ...] = (IM_START, IM_END)
    pretty_json: bool = True

    @property
    def vocab_size(self) -> int:
        """Ids 0..vocab_size-1 are valid, special tokens included."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """`<|im_end|>` ends a chat turn, `<|endoftext|>` a plain completion (Qwen's convention)."""
        return (self.special_ids[IM_END], self.special_ids[ENDOFTEXT])

    @property
    def pad_token_id(self) -> int:
        return self.special_ids[ENDOFTEXT]

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; special token strings inside it map to their ids."""
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens kept; ids outside the vocabulary decode to nothing."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))


def train_tokenizer(corpus: Sequence[str] = CORPUS, vocab_size: int = TARGET_VOCAB_SIZE) -> TrainedTokenizer:
    """Train the byte-level BPE.

    Args:
        corpus: training texts, each one sequence (merges never cross two of them).
        vocab_size: target size including the 256 byte symbols and the special tokens; the
            result is smaller only if the corpus runs out of pairs to merge.

    Returns:
        The tokenizer with special tokens at ids 0, 1, 2 (`SPECIAL_TOKENS` order).
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    return TrainedTokenizer(tok, {t: int(i) for t, i in ids.items() if i is not None})


def tokenizer_json(trained: TrainedTokenizer) -> str:
    """The `tokenizer.json` text (stable key order, so hashes are reproducible)."""
    return str(trained.tokenizer.to_str(pretty=trained.pretty_json)) + "\n"


def tokenizer_config(trained: TrainedTokenizer, model_max_length: int) -> dict[str, Any]:
    """`tokenizer_config.json` in the shape of Qwen's (no BOS, EOS `<|im_end|>`, pad `<|endoftext|>`).

    The chat template lives in its own `chat_template.jinja` file beside it, not in this file.
    `added_tokens_decoder` lists the tokenizer's own added tokens with their flags, by id.
    """
    decoder = trained.tokenizer.get_added_tokens_decoder()
    added = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(decoder.items())
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": list(trained.additional_special_tokens),
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
