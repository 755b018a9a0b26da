"""Tiny random Llama models for unit tests (seconds to build, no files)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(
    *,
    vocab_size: int = 96,
    hidden_size: int = 32,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    max_positions: int = 256,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    initializer_range: float = 0.4,
) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        # A wide init makes attention and MLPs matter: with the default 0.02 the residual
        # stream dominates and greedy output just repeats one token.
        initializer_range=initializer_range,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype)  # type: ignore[arg-type]
    model.eval()
    return model
