"""One target pass over many sequences' blocks, each against its own KV cache.

A batch step packs every request's block (its pending token, then its drafts) into one
sequence of ``N = sum(1 + k_i)`` rows. Everything in a decoder layer but attention works row
by row, so the packed rows go through the projections, MLPs and the output head together
(one matmul of ``N`` rows instead of one per request: the point of batching). Attention is
the one place where rows of different requests must not meet: :class:`RaggedCache` appends
each request's keys and values to that request's own ``DynamicCache`` (so each is rewound
on its own after its verdict), and :func:`ragged_attention` attends each request's rows
against its own keys, row by row, exactly as a one-token pass at that position would
(:mod:`serving.models.exact_attention`). The positions are each request's own.

Why not transformers' padded batches or its continuous-batching manager: a padded batch
shares one cache length, so per-request rewinds after ragged acceptance would leave holes;
the continuous-batching manager's paged cache has no per-request rewind and schedules its
own generation loop. transformers' model forward, its layers, rotary embeddings and cache
layers are used as they are; only the cache wrapper and the attention function are ours.

Batch-invariant by construction on the ``cpu`` target: its packed linear layers give each
row the same result whatever the row count (measured up to 200 rows, every layer shape of
SmolLM2-135M), and attention is computed per row alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from serving.engine.kv import Cache
from serving.errors import SpecOpsError
from serving.models.exact_attention import exact_rows
from serving.target import LoadedTarget

IMPLEMENTATION = "specops_ragged"
_BASE = "specops_ragged_base"  # the config key remembering what a solo pass uses


@dataclass
class RaggedCache:
    """The per-request caches of one packed pass, as one cache object for the model."""

    caches: Sequence[Cache]
    bounds: list[tuple[int, int]]  # each request's rows in the packed pass
    # layer -> each request's full keys and values after this pass's update
    full: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """``key_states`` ``[1, kv_heads, N, d]``: split by request and appended to each
        request's cache; the packed tensors come back unchanged (attention reads
        :attr:`full`)."""
        self.full[layer_idx] = [
            cache.update(key_states[:, :, a:b], value_states[:, :, a:b], layer_idx)
            for cache, (a, b) in zip(self.caches, self.bounds, strict=True)
        ]
        return key_states, value_states


def ragged_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention-function signature. In a packed pass (``specops_ragged`` in
    the kwargs) each request's rows of ``query`` ``[1, heads, N, d]`` attend to that
    request's keys alone; otherwise the model's own attention runs."""
    ragged: RaggedCache | None = kwargs.pop("specops_ragged", None)
    if ragged is None:
        base = ALL_ATTENTION_FUNCTIONS[getattr(module.config, _BASE, "sdpa")]
        return base(module, query, key, value, attention_mask, **kwargs)
    outputs = [
        exact_rows(module, query[:, :, a:b], keys, values, **kwargs)
        for (a, b), (keys, values) in zip(ragged.bounds, ragged.full[module.layer_idx], strict=True)
    ]
    return torch.cat(outputs, dim=1), None  # [1, N, heads, d]


def use_ragged_attention(model: PreTrainedModel) -> None:
    """Let ``model`` take packed passes (in place): its attention becomes
    :func:`ragged_attention`, which runs the model's previous attention for every other
    pass. Only for models whose layers call ``past_key_values.update`` and an attention
    function (transformers' Llama family and the fused layers of serving.models.fused)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = model.config
    current = config._attn_implementation
    if current == IMPLEMENTATION:
        return
    if current not in ("sdpa", "specops_exact"):
        raise SpecOpsError(f"batched decoding needs SDPA attention; this model uses {current!r}")
    AttentionInterface.register(IMPLEMENTATION, ragged_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    setattr(config, _BASE, current)
    config._attn_implementation = IMPLEMENTATION


@dataclass(frozen=True)
class PackedOutput:
    logits: list[torch.Tensor]  # per request [1 + k_i, vocab]
    hidden: list[torch.Tensor | None]  # per request [1 + k_i, hidden] where asked for


def packed_pass(
    target: LoadedTarget,
    caches: Sequence[Cache],
    blocks: Sequence[torch.Tensor],
    *,
    want_hidden: Sequence[bool] = (),
) -> PackedOutput:
    """One target pass over every request's ``blocks[i]`` ``[1 + k_i]``, request ``i``
    extending ``caches[i]``. The target must have :func:`use_ragged_attention`. Call under
    ``torch.inference_mode()``; on error the caches may hold part of the pass (callers
    rewind them)."""
    if target.config._attn_implementation != IMPLEMENTATION:
        raise SpecOpsError("the target takes no packed passes: call use_ragged_attention first")
    bounds: list[tuple[int, int]] = []
    positions: list[torch.Tensor] = []
    start = 0
    for cache, block in zip(caches, blocks, strict=True):
        length = int(cache.get_seq_length())
        rows = int(block.shape[0])
        bounds.append((start, start + rows))
        positions.append(torch.arange(length, length + rows, device=block.device))
        start += rows
    input_ids = torch.cat(list(blocks))[None]  # [1, N]
    ragged = RaggedCache(caches, bounds)
    hidden_wanted = any(want_hidden)
    out = target(
        input_ids=input_ids,
        position_ids=torch.cat(positions)[None],  # [1, N] each request's own positions
        # A 4-D mask makes transformers skip building one; ragged_attention needs none.
        attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=input_ids.device),
        past_key_values=ragged,
        use_cache=True,
        output_hidden_states=hidden_wanted,
        specops_ragged=ragged,
    )
    logits = out.logits[0]  # [N, vocab]
    last_hidden = out.hidden_states[-1][0] if hidden_wanted else None  # [N, hidden]
    wanted = list(want_hidden) or [False] * len(bounds)
    return PackedOutput(
        logits=[logits[a:b] for a, b in bounds],
        hidden=[
            last_hidden[a:b] if last_hidden is not None and wants else None
            for (a, b), wants in zip(bounds, wanted, strict=True)
        ],
    )
