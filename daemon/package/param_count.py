"""Parameter counts of a Qwen3-style transformer from its `Architecture`: stored, and read per token.

Owns one piece of arithmetic the presets and the derived timing tables share: how many weights a
model stores, and how many a decode step reads (the figure decode time follows when it is bound
by memory bandwidth). A mixture-of-experts layer reads its attention, its router and only the
`experts_per_token` experts a token routes to; a dense layer reads everything. Every step reads
the output head whole; the input embedding contributes one row per token (ignored). Norm weights
are counted (Qwen3 has RMSNorm on the layer input, after attention, and on Q and K per head).

    attention  = hidden x (q_heads + 2 kv_heads) x head_dim + q_heads x head_dim x hidden
    dense FFN  = 3 x hidden x intermediate_size                         (gate, up, down)
    MoE FFN    = experts x 3 x hidden x expert_intermediate + hidden x experts (router)
    head       = vocab x hidden, stored once more unless the embeddings are tied
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.daemon.package.manifest import Architecture


@dataclass(frozen=True)
class ParamCount:
    """Weights of one model.

    Attributes:
        stored: every weight the model holds (the parameter file).
        read_per_token: the weights one decode step reads (active experts only).
    """

    stored: int
    read_per_token: int


def param_count(arch: Architecture) -> ParamCount:
    """Count `arch`'s weights (see the module docstring for the formulas)."""
    h, d = arch.hidden_size, arch.head_dim
    attention = h * (arch.q_heads + 2 * arch.kv_heads) * d + arch.q_heads * d * h
    norms = 2 * h + 2 * d  # input and post-attention RMSNorm, Q and K norms
    if arch.dense:
        ffn_stored = ffn_read = 3 * h * arch.intermediate_size
    else:
        expert = 3 * h * arch.expert_intermediate
        router = h * arch.experts
        ffn_stored = arch.experts * expert + router
        ffn_read = arch.experts_per_token * expert + router
    head = arch.vocab_size * h
    embeddings = head if arch.tied_embeddings else 2 * head
    final_norm = h
    layers_stored = arch.layers * (attention + norms + ffn_stored)
    layers_read = arch.layers * (attention + norms + ffn_read)
    return ParamCount(
        stored=layers_stored + embeddings + final_norm,
        read_per_token=layers_read + head + final_norm,
    )
