"""KV-cache bookkeeping in one place: every rewind after a rejection goes through here.

A cache is transformers' or a lean step's (:data:`serving.target.Cache`); a fresh one
comes from :meth:`serving.target.LoadedTarget.new_cache`, or, for a draft's own module,
:func:`serving.target.dynamic_cache`.
"""

from __future__ import annotations

from serving.errors import SpecOpsError
from serving.target import Cache, dynamic_cache

__all__ = ["Cache", "cache_length", "dynamic_cache", "rewind"]


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
