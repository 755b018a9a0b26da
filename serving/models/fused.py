"""Fused projections for Llama-style decoder layers: one q|k|v matmul, one gate|up matmul.

A one-token pass of SmolLM2-135M on a quantised target costs about as much in per-call
overhead (dispatch, the bfloat16 casts around each kernel) as in the matmuls themselves, and
five of each layer's seven matmuls are the query/key/value and gate/up projections of one
input. Stacking their weights row-wise makes 4 calls per layer instead of 7. Each output
row is still one dot product per output channel, and the quantisers work row by row, so
the fused layers' codes equal the separate layers' codes (tested); only the call count
changes. RMSNorm runs as torch's one fused op.

The fused layers replace ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj`` on
the module itself, whose ``forward`` becomes the fused one; :func:`unfuse_projections`
restores the original layout (for export: a folder transformers can load).
"""

from __future__ import annotations

from collections.abc import Callable
from types import MethodType
from typing import Any

import torch
from torch import nn
from transformers.models.llama.modeling_llama import (
    ALL_ATTENTION_FUNCTIONS,
    LlamaAttention,
    LlamaMLP,
    LlamaRMSNorm,
    apply_rotary_pos_emb,
    eager_attention_forward,
)

_ATTENTION = ("q_proj", "k_proj", "v_proj")
_MLP = ("gate_proj", "up_proj")


def _stack(layers: list[nn.Linear]) -> nn.Linear:
    first = layers[0]
    has_bias = first.bias is not None
    # On the layers' own device and dtype: a model fused after ``.to("cuda")`` (the GPU's
    # graphed step) must not get a CPU float32 layer back (found on an H200).
    fused = nn.Linear(
        first.in_features,
        sum(x.out_features for x in layers),
        bias=has_bias,
        device=first.weight.device,
        dtype=first.weight.dtype,
    )
    with torch.no_grad():
        fused.weight.copy_(torch.cat([x.weight.detach() for x in layers]))
        if has_bias:
            fused.bias.copy_(torch.cat([x.bias.detach() for x in layers]))  # type: ignore[misc]
    return fused


def _fusable(module: nn.Module, names: tuple[str, ...]) -> bool:
    children = [getattr(module, name, None) for name in names]
    return all(type(c) is nn.Linear for c in children) and (
        len({c.in_features for c in children}) == 1  # type: ignore[union-attr]
        and len({c.bias is None for c in children}) == 1  # type: ignore[union-attr]
    )


def _attention_forward(
    self,
    hidden_states,
    position_embeddings=None,
    attention_mask=None,
    past_key_values=None,
    **kwargs,
):
    # transformers' LlamaAttention.forward (5.x) with the three projections as one.
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query, key, value = self.qkv_proj(hidden_states).split(self.specops_split, dim=-1)
    query_states = query.view(hidden_shape).transpose(1, 2)
    key_states = key.view(hidden_shape).transpose(1, 2)
    value_states = value.view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
    if past_key_values is not None:
        key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)
    attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, eager_attention_forward
    )
    attn_output, attn_weights = attention_interface(
        self,
        query_states,
        key_states,
        value_states,
        attention_mask,
        dropout=0.0,
        scaling=self.scaling,
        **kwargs,
    )
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return self.o_proj(attn_output), attn_weights


def _mlp_forward(self, x):
    gate, up = self.gate_up_proj(x).split(self.specops_split, dim=-1)
    return self.down_proj(self.act_fn(gate) * up)


def _rms_norm_forward(self, hidden_states):
    # One fused op (torch.nn.functional.rms_norm) instead of the eight of LlamaRMSNorm's
    # float32 forward: the same formula, per row, so still batch-invariant.
    return nn.functional.rms_norm(
        hidden_states, self.weight.shape, self.weight, self.variance_epsilon
    )


def fuse_norms(model: nn.Module) -> int:
    """Run every float32 Llama RMSNorm of ``model`` as one fused op; return how many."""
    fused = 0
    for module in model.modules():
        if type(module) is LlamaRMSNorm and module.weight.dtype == torch.float32:
            module.forward = MethodType(_rms_norm_forward, module)  # type: ignore[method-assign]
            fused += 1
    return fused


def fuse_projections(model: nn.Module) -> int:
    """Fuse the projections of every Llama attention and MLP of ``model`` in place (float
    layers, before any packing or quantisation); return how many modules were fused. Other
    architectures are left as they are."""
    plans: dict[type, tuple[str, tuple[str, ...], Callable[..., Any]]] = {
        LlamaAttention: ("qkv_proj", _ATTENTION, _attention_forward),
        LlamaMLP: ("gate_up_proj", _MLP, _mlp_forward),
    }
    fused = 0
    for module in model.modules():
        plan = plans.get(type(module))
        if plan is None or not _fusable(module, plan[1]):
            continue
        fused_name, names, forward = plan
        layers = [getattr(module, name) for name in names]
        setattr(module, fused_name, _stack(layers))
        module.specops_split = [x.out_features for x in layers]  # type: ignore[assignment]
        for name in names:
            delattr(module, name)
        module.forward = MethodType(forward, module)  # type: ignore[method-assign]
        fused += 1
    return fused


def unfuse_projections(model: nn.Module) -> int:
    """Undo :func:`fuse_projections` on float layers (``nn.Linear``): the original
    projections and ``forward`` come back. Returns how many modules were restored."""
    restored = 0
    for module in model.modules():
        for fused_name, names in (("qkv_proj", _ATTENTION), ("gate_up_proj", _MLP)):
            fused = getattr(module, fused_name, None)
            if not isinstance(fused, nn.Linear):
                continue
            start = 0
            for name, size in zip(names, module.specops_split, strict=True):  # type: ignore[arg-type]
                part = nn.Linear(fused.in_features, size, bias=fused.bias is not None)
                with torch.no_grad():
                    part.weight.copy_(fused.weight[start : start + size])
                    if fused.bias is not None:
                        part.bias.copy_(fused.bias[start : start + size])
                setattr(module, name, part)
                start += size
            delattr(module, fused_name)
            del module.specops_split
            del module.forward  # the class's own forward again
            restored += 1
        if getattr(getattr(module, "forward", None), "__func__", None) is _rms_norm_forward:
            del module.forward
    return restored
