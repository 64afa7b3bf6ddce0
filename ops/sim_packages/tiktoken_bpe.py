"""tiktoken BPE ranks -> a Hugging Face byte-level BPE model that encodes identically.

Owns the conversion only: parsing a `.tiktoken` ranks file (one `base64(token) rank` per line),
GPT-2's byte-to-unicode alphabet (what the `ByteLevel` pre-tokenizer and decoder use), and the
merges derived from the ranks. Data flow: `parse_tiktoken_ranks` -> `derive_merges` ->
`byte_level_bpe` (a `tokenizers.models.BPE`, ids = ranks). Pre-tokenization, normalization and
special tokens belong to the caller (`qwen3_tokenizer.py`).

How the merges are derived: for every token t of two or more bytes, tiktoken's own BPE is run on
t's bytes using only ranks below rank(t); it must stop at exactly two parts (l, r), and (l, r)
becomes the merge of priority rank(t). A token for which it does not is refused (ValueError).

Why HF's BPE then equals tiktoken's on every input: tiktoken repeatedly joins the leftmost
adjacent pair whose concatenation has the lowest rank; HF joins the leftmost adjacent pair that
is a listed merge with the lowest priority. When tiktoken (in any text) joins a, b into t, every
earlier merge touching t's bytes stayed inside them and ran in the isolated run's order (the
global minimum restricted to t's span is the span's own minimum); had one of them ranked above
rank(t), the isolated run would have stopped there with three or more parts, which is refused.
So (a, b) is t's listed merge, HF's candidates are a subset of tiktoken's under the same key,
and both take the same pair at every step. tiktoken's shortcut (a pre-tokenized piece that is
itself a token maps straight to it) changes nothing: by the same argument the full BPE of any
token's bytes ends in that token, so `ignore_merges` stays false, as in Qwen2's tokenizer.json.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from tokenizers import models

_NO_RANK = 1 << 62


def byte_level_alphabet() -> tuple[str, ...]:
    """GPT-2's byte-to-unicode table: entry b is the character that stands for byte b.

    Printable Latin-1 bytes map to themselves; the other 68 map to U+0100 upwards in byte order
    (so a space is 'Ġ'), the same table `tokenizers.pre_tokenizers.ByteLevel` uses.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


def parse_tiktoken_ranks(data: bytes) -> dict[bytes, int]:
    """Parse a `.tiktoken` file: `base64(token) rank` per line.

    Args:
        data: the file's bytes.

    Returns:
        token bytes -> rank, in file order.

    Raises:
        ValueError: a malformed line, a repeated token or rank, ranks other than exactly
            0..n-1, or a single byte missing (some text could not be encoded).
    """
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError("expected 'base64-token rank'")
            token, rank = base64.b64decode(fields[0], validate=True), int(fields[1])
        except (ValueError, binascii.Error) as exc:
            raise ValueError(f"ranks line {lineno}: {exc}") from None
        if not token or token in ranks:
            raise ValueError(f"ranks line {lineno}: empty or repeated token")
        ranks[token] = rank
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("ranks: expected each of 0..n-1 exactly once (ranks are the token ids)")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"ranks: {len(missing)} single bytes have no token (e.g. {missing[0]:#04x})")
    return ranks


def split_token(token: bytes, ranks: Mapping[bytes, int]) -> tuple[bytes, bytes] | None:
    """The merge that makes `token`: tiktoken's BPE on its bytes with ranks below its own.

    Args:
        token: a token of two or more bytes, present in `ranks`.
        ranks: all tokens' ranks.

    Returns:
        (left, right) with left + right == token, or None when the run stops at three or more
        parts (tiktoken could never produce `token` by merging).
    """
    if len(token) == 2:
        return token[:1], token[1:]  # two single bytes: the run makes no merge
    limit, get = ranks[token], ranks.get
    parts = [token[i : i + 1] for i in range(len(token))]
    # pair_ranks[i] = rank of parts[i] + parts[i+1]; only the two neighbours change per merge.
    pair_ranks = [get(token[i : i + 2], _NO_RANK) for i in range(len(token) - 1)]
    while len(parts) > 2:
        best = min(pair_ranks)
        if best >= limit:
            return None
        i = pair_ranks.index(best)  # leftmost of equal ranks, as tiktoken
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i < len(parts) - 1:
            pair_ranks[i] = get(parts[i] + parts[i + 1], _NO_RANK)
        if i > 0:
            pair_ranks[i - 1] = get(parts[i - 1] + parts[i], _NO_RANK)
    return parts[0], parts[1]


def derive_merges(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in rank order (HF's merge priority = list position).

    Args:
        ranks: token bytes -> rank, as `parse_tiktoken_ranks` returns them.

    Returns:
        (left, right) byte pairs; entry k makes the k-th multi-byte token by rank.

    Raises:
        ValueError: a token tiktoken could never produce by merging (see `split_token`); the
            converted model would then differ from tiktoken.
    """
    merges: list[tuple[bytes, bytes]] = []
    for token in sorted((t for t in ranks if len(t) > 1), key=ranks.__getitem__):
        pair = split_token(token, ranks)
        if pair is None:
            raise ValueError(f"token {token!r} (rank {ranks[token]}) is unreachable by BPE merges")
        merges.append(pair)
    return merges


def byte_level_bpe(ranks: Mapping[bytes, int]) -> models.BPE:
    """The HF BPE model of `ranks`: byte-level vocabulary (id = rank) and the derived merges.

    Raises:
        ValueError: see `derive_merges`.
    """
    table = byte_level_alphabet()

    def text(token: bytes) -> str:
        return "".join([table[b] for b in token])

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [(text(left), text(right)) for left, right in derive_merges(ranks)]
    return models.BPE(vocab=vocab, merges=merges, ignore_merges=False, byte_fallback=False)
