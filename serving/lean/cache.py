"""The lean step's KV cache: preallocated buffers and a length; a rewind sets the length.

Values of every layer live in one ``[layers, kv_heads, capacity, head_dim]`` float32
buffer; keys in one ``[layers, kv_heads, capacity / 16, head_dim, 16]``, transposed in
blocks of 16 positions (a position's key is a column of its block), so that the attention
op computes a row's scores for 16 positions as one chain of multiply-adds. A pass writes
its rows at ``length..length + rows`` and attends to ``0..position``; rejecting drafts only
lowers :attr:`length` (nothing is freed or copied).
The buffers grow (doubling, copied once) when a request outgrows them, up to the model's
position limit. The methods the engine calls on a transformers cache are here too
(``get_seq_length``, ``crop``), so every front keeps its bookkeeping in :mod:`serving.engine.kv`.
"""

from __future__ import annotations

import torch

from serving.errors import SpecOpsError

INITIAL_CAPACITY = 512
KEY_BLOCK = 16  # positions per transposed key block (serving/lean/attend.cpp's kBlock)


def _blocks(positions: int) -> int:
    return -(-positions // KEY_BLOCK)


class Length:
    """A cache's length and the two methods the engine calls on a transformers cache
    (``get_seq_length``, ``crop``): every cache of a lean step is one."""

    length: int

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """transformers' rule: a negative count drops that many trailing tokens; a
        non-negative one keeps at most that many."""
        new = self.length + max_length if max_length < 0 else min(max_length, self.length)
        if new < 0:
            raise SpecOpsError(f"cannot crop {-max_length} tokens from a cache of {self.length}")
        self.length = new


class LeanCache(Length):
    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        *,
        limit: int,
        capacity: int = INITIAL_CAPACITY,
    ) -> None:
        self.limit = limit
        blocks = _blocks(min(capacity, limit))
        # Uninitialised: a pass reads only positions some pass has written (0..its own;
        # the op clears a key block when it writes the block's first position).
        self.keys = torch.empty(layers, kv_heads, blocks, head_dim, KEY_BLOCK)
        self.values = torch.empty(layers, kv_heads, blocks * KEY_BLOCK, head_dim)
        self.length = 0

    @property
    def capacity(self) -> int:
        """Positions the buffers hold (a whole number of key blocks)."""
        return int(self.values.shape[2])

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` more tokens, or a :class:`SpecOpsError` naming the limit."""
        needed = self.length + rows
        if needed > self.limit:
            raise SpecOpsError(
                f"a pass to {needed} tokens runs past the model's {self.limit} positions"
            )
        if needed <= self.capacity:
            return
        blocks = _blocks(min(self.limit, max(needed, 2 * self.capacity)))
        layers, kv_heads, _, head_dim = self.values.shape
        keys = torch.empty(layers, kv_heads, blocks, head_dim, KEY_BLOCK)
        kept = _blocks(self.length)
        keys[:, :, :kept] = self.keys[:, :, :kept]
        values = torch.empty(layers, kv_heads, blocks * KEY_BLOCK, head_dim)
        values[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values = keys, values
