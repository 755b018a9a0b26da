"""One helper for the exactness tests: a block pass beside the one-token passes it must equal."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def block_and_singles(model, ids: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the last ``rows`` positions of ``ids`` ([1, n]) from one pass over a cache
    of the rest, and from ``rows`` one-token passes over the same cache: ``[rows, vocab]``
    each."""
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(ids[:, :-rows], past_key_values=cache, use_cache=True)
        block = model(ids[:, -rows:], past_key_values=cache, use_cache=True).logits[0]
        cache.crop(-rows)
        singles = [
            model(ids[:, p : p + 1], past_key_values=cache, use_cache=True).logits[0, 0]
            for p in range(ids.shape[1] - rows, ids.shape[1])
        ]
    return block, torch.stack(singles)
