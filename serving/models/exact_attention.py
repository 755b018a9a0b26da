"""Attention whose every row is computed exactly as a one-token pass would compute it.

Speculative decoding is lossless only if a verification pass over ``1 + k`` tokens computes,
for each position, exactly what one-token decoding computes there. The packed and
quantised linear layers are batch-invariant row by row, but torch's CPU attention kernel is
not: its result for a query row depends on how many query rows share the call (measured on
SmolLM2-135M: the `cpu` target's logits move by ~3e-5, which flips a near-tie argmax now and
then; the quantised targets round activations to bfloat16 before every matmul, which turns
that into logit moves of ~0.2 and diverging outputs within a few tokens).

So a pass that extends a cache by a few tokens attends row by row here: row ``i`` of ``M``
sees exactly the keys a one-token pass at its position would see, through the very same
SDPA call a one-token pass makes. That costs one attention call per drafted token (the
measured verify curves include it); prefill passes — nothing cached yet, shared by plain
and speculative decoding alike — and batches of several sequences keep transformers' SDPA.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

IMPLEMENTATION = "specops_exact"
MAX_ROWS = 64  # verification blocks are at most 16 tokens; larger passes are prefills


def exact_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention-function signature: ``query`` [b, heads, M, d], ``key`` and
    ``value`` [b, kv_heads, L, d] (the cache plus this pass); returns ([b, M, heads, d],
    None)."""
    rows, length = query.shape[2], key.shape[2]
    if query.shape[0] != 1 or rows == length or rows > MAX_ROWS:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return exact_rows(module, query, key, value, **kwargs), None


def exact_rows(module, query, key, value, **kwargs) -> torch.Tensor:
    """``query`` ``[1, heads, M, d]``: the last ``M`` positions of the ``L`` in ``key`` and
    ``value`` ``[1, kv_heads, L, d]``; each row attends alone, to keys ``0..its position``,
    through the very call a one-token pass makes there (no mask: transformers drops an
    all-visible one). Returns ``[1, M, heads, d]``."""
    rows, length = query.shape[2], key.shape[2]
    outputs = []
    for row in range(rows):
        visible = length - rows + row + 1
        out, _ = sdpa_attention_forward(
            module,
            query[:, :, row : row + 1],
            key[:, :, :visible],
            value[:, :, :visible],
            None,
            **kwargs,
        )
        outputs.append(out)  # [1, 1, heads, d]
    return outputs[0] if rows == 1 else torch.cat(outputs, dim=1)


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, exact_sdpa)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def use_exact_attention(model: torch.nn.Module) -> None:
    """Switch ``model`` (a transformers model using SDPA) to :func:`exact_sdpa` in place."""
    register()
    config: Any = model.config
    if config._attn_implementation in ("sdpa", IMPLEMENTATION):
        config._attn_implementation = IMPLEMENTATION
