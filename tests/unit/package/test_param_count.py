"""Parameter counts: the published totals of Qwen3-30B-A3B and Qwen3-4B, and what a token reads."""

from __future__ import annotations

from dataclasses import replace

from calculet.daemon.package.param_count import param_count
from calculet.daemon.package.presets import QWEN3_4B, QWEN3_30B_A3B

# The models' safetensors totals (Hugging Face model cards: 30.5B and 4.0B).
A3B_WEIGHTS = 30_532_122_624
QWEN3_4B_WEIGHTS = 4_022_468_096


def test_stored_weights_are_the_published_totals() -> None:
    assert param_count(QWEN3_30B_A3B.architecture).stored == A3B_WEIGHTS
    assert param_count(QWEN3_4B.architecture).stored == QWEN3_4B_WEIGHTS


def test_a_dense_token_reads_every_weight_an_moe_token_its_active_experts() -> None:
    dense = param_count(QWEN3_4B.architecture)
    assert dense.read_per_token == dense.stored
    a = QWEN3_30B_A3B.architecture
    moe = param_count(a)
    idle_experts = (a.experts - a.experts_per_token) * 3 * a.hidden_size * a.expert_intermediate * a.layers
    input_embedding = a.vocab_size * a.hidden_size  # one row per token, not read whole
    assert moe.read_per_token == moe.stored - idle_experts - input_embedding
    assert 3.0e9 < moe.read_per_token < 3.1e9  # "3B active" (3.3B with both embeddings)


def test_untied_embeddings_store_the_head_twice() -> None:
    arch = QWEN3_4B.architecture
    untied = param_count(replace(arch, tied_embeddings=False))
    assert untied.stored - param_count(arch).stored == arch.vocab_size * arch.hidden_size
    assert untied.read_per_token == param_count(arch).read_per_token
