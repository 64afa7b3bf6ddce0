"""The tiny package twice, with full logits and with the device's top-k output, and its decoder:
what the engine tests of constrained decoding and of the thinking budget run on (tokens must be
equal between the two)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

from calculet.daemon.package.manifest import load_manifest
from calculet.ops.sim_packages.build import build_sim_package

FULL, TOPK = "tiny", "tinytopk"


def build_tiny_pair(root: Path, k: int) -> Path:
    """`root/tiny` (full logits) and `root/tinytopk` (the top `k`); returns `root`."""
    build_sim_package("tiny", root / FULL)
    build_sim_package("tiny", root / TOPK, logits_topk=k)
    return root


def tiny_decoder(models: Path) -> Callable[[list[int]], str]:
    """Token ids -> text with the tiny package's own tokenizer (special tokens left out)."""
    tok = Tokenizer.from_file(str(models / FULL / load_manifest(models / FULL).tokenizer.path))
    return lambda ids: tok.decode(ids, skip_special_tokens=True)
