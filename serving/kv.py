"""KV-cache bookkeeping in one place: every rewind after a rejection goes through here."""

from __future__ import annotations

from transformers import DynamicCache

from serving.errors import SpecOpsError
from serving.lean.cache import LeanCache
from serving.lean.graphed import GraphedCache

# transformers', or the lean step's (serving.lean: the CPU's or the GPU's)
Cache = DynamicCache | LeanCache | GraphedCache


def new_cache(model) -> Cache:
    """A fresh cache for ``model``: the lean step's (:mod:`serving.lean`) where ``model``
    has one, else transformers'. Only full-attention caches can be rewound safely."""
    lean = getattr(model, "specops_lean", None)
    if lean is not None:
        return lean.new_cache()
    config = model.config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        raise SpecOpsError(
            f"{config.model_type!r} uses sliding-window attention, whose cache cannot be "
            "rewound after a rejected draft; use a full-attention model"
        )
    return DynamicCache(config=config)


def cache_length(cache: Cache) -> int:
    return int(cache.get_seq_length())


def rewind(cache: Cache, length: int) -> None:
    """Drop cache entries past ``length`` tokens (rejected drafts). Never grows the cache."""
    current = cache_length(cache)
    if length > current:
        raise SpecOpsError(f"cannot rewind a cache of {current} tokens forward to {length}")
    if length < current:
        # transformers 5.x: a negative count removes that many trailing tokens.
        cache.crop(length - current)
