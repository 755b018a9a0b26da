"""A draft head's step on the lean path: its block through the lean ops, its reduced output
layer on its target's kernels, a one-layer :class:`LeanCache` of its own.

The head (:class:`serving.models.head.DraftHead`) is copied and its copy put on the target's
kernel family (its projections fused, then packed or quantised as the target's are, so the
block of an int4 target runs on the int4 tiles); the rows of the target's output layer that
its reduced vocabulary keeps are quantised the same way. A pass over ``n`` pairs
``(f_i, x_{i+1})`` makes: one gather and concatenation, the ``fc`` matmul, the block (one
``ops.stack`` call when its projections are on one integer kernel and it has its input norm,
otherwise the layer's ops from Python) and the final norm. Greedy drafting then takes one
matmul over the reduced vocabulary and an argmax: no logits over the full vocabulary and no
softmax; on the integer kernels a whole greedy draft is one native call
(``ops.head_draft``, :meth:`LeanHeadStep.draft_greedy`), equal to drafting op by op.

It computes what ``DraftHead`` computes up to its kernels' rounding (float32 between ops, the
integer kernels rounding activations to int8): ``tests/serving/lean/test_head_step.py``
bounds the difference on the tiny model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from transformers import PreTrainedModel

from serving.errors import SpecOpsError
from serving.lean.build import load_ops
from serving.lean.cache import LeanCache
from serving.lean.step import Matmul, matmul_of, stack_weights_of, unsupported_reason
from serving.lean.tiles import adopt_tiles
from serving.models.head import DraftHead, output_weight
from serving.models.kernels import apply_kernels, kernels_of

_BF16 = torch.bfloat16


@dataclass(frozen=True)
class _Linear:
    run: Matmul
    bf16: bool  # takes bfloat16 input (a torch kernel) rather than float32
    bias: torch.Tensor | None


def _linear(layer: nn.Module) -> _Linear:
    """A head layer on its kernel; one whose shape the kernel family does not take (the
    integer kernels want inputs in multiples of 32) stayed a float layer and runs so."""
    bias = getattr(layer, "bias", None)
    if type(layer) is nn.Linear:
        weight = layer.weight.detach().float()
        return _Linear(lambda x: torch.nn.functional.linear(x, weight), False, _float(bias))
    run, bf16 = matmul_of(layer)
    return _Linear(run, bf16, _float(bias))


def _tiles(layer: nn.Module, bits: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``layer``'s tiles and scales when it is on the integer kernel of ``bits``."""
    from serving.models.quantized import Int4Linear, Int8Linear

    kind = {4: Int4Linear, 8: Int8Linear}.get(bits)
    tiles, scales = getattr(layer, "tiles", None), getattr(layer, "tile_scales", None)
    if kind is None or not isinstance(layer, kind) or tiles is None or scales is None:
        return None
    return tiles, scales


def _float(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.detach().float()


def _apply(linear: _Linear, x: torch.Tensor) -> torch.Tensor:
    out = linear.run(x.to(_BF16) if linear.bf16 else x)
    if out.dtype != torch.float32:
        out = out.float()
    return out if linear.bias is None else out + linear.bias


class LeanHeadStep:
    """``head``'s forward for the target ``model`` (a model the lean step runs, see
    :func:`serving.lean.step.unsupported_reason`; see the module doc); ``head`` is left as
    it is."""

    def __init__(self, head: DraftHead, model: PreTrainedModel) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise SpecOpsError(f"the lean head step cannot run for this target: {reason}")
        load_ops()
        self.ops = torch.ops.specops_lean
        config = head.head_config
        kernels = kernels_of(model)
        packed = copy.deepcopy(head).float().eval()
        apply_kernels(packed, kernels, exact=False, fuse=True)
        vocab_ids = head.vocab_ids
        rows = output_weight(model).detach().float()
        if vocab_ids is not None:
            rows = rows[vocab_ids]
        output = nn.ModuleList([nn.Linear(rows.shape[1], rows.shape[0], bias=False)])
        output[0].weight = nn.Parameter(rows.clone(), requires_grad=False)
        apply_kernels(output, kernels, exact=False)
        adopt_tiles(packed)
        adopt_tiles(output)
        self.vocab_ids = vocab_ids  # [draft_vocab] full-vocabulary ids, or None: all of them
        embed = cast(nn.Module, model.get_input_embeddings())
        self.embed = cast(torch.Tensor, embed.weight).detach().float()
        self.fc = _linear(packed.fc)
        layer = packed.layer
        attention, mlp = cast(nn.Module, layer.self_attn), cast(nn.Module, layer.mlp)
        if not hasattr(attention, "qkv_proj") or not hasattr(mlp, "gate_up_proj"):
            raise SpecOpsError(
                f"the head's block was not fused on kernels {kernels!r}; it cannot "
                "take the lean step"
            )
        self.qkv = _linear(cast(nn.Module, attention.qkv_proj))
        self.out = _linear(cast(nn.Module, attention.o_proj))
        self.gate_up = _linear(cast(nn.Module, mlp.gate_up_proj))
        self.down = _linear(cast(nn.Module, mlp.down_proj))
        self.output = _linear(output[0])
        self.input_norm = (
            layer.input_layernorm.weight.detach() if config.input_norm else None
        )  # EAGLE-1's layout has none
        self.post_norm = layer.post_attention_layernorm.weight.detach()
        norm = cast(torch.Tensor, getattr(packed.norm, "weight", None))
        self.final_norm = norm.detach() if config.output_norm else None
        self.stack_bits = 0
        self.stack_weights: list[torch.Tensor] = []
        if config.input_norm:
            self.stack_bits, self.stack_weights = stack_weights_of([layer])
        # Greedy drafts in one native call (ops.head_draft) when fc, the block and the
        # output rows are all on one integer kernel's tiles.
        self.native = _tiles(packed.fc, self.stack_bits), _tiles(output[0], self.stack_bits)
        self.fc_bias = _float(packed.fc.bias)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        self.limit = config.max_position_embeddings
        rotary = packed.rotary
        angles = torch.outer(torch.arange(self.limit, dtype=torch.float32), rotary.inv_freq.float())
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        self.cos = (angles.cos() * scaling).contiguous()
        self.sin = (angles.sin() * scaling).contiguous()

    def new_cache(self) -> LeanCache:
        return LeanCache(1, self.kv_heads, self.head_dim, limit=self.limit)

    def feed(self, features: torch.Tensor, tokens: torch.Tensor, cache: LeanCache) -> torch.Tensor:
        """Append the pairs ``(features[j], tokens[j])`` (``[n, hidden]``, ``[n]``) at
        ``cache``'s next positions; return the predicted features ``[n, hidden]`` float32.
        Call under ``torch.inference_mode()``."""
        count = int(tokens.shape[0])
        start = cache.length
        cache.reserve(count)
        embeds = self.embed[tokens]  # [n, hidden]
        x = _apply(self.fc, torch.cat([features.float(), embeds], dim=1)).contiguous()
        positions = torch.arange(start, start + count)
        cos, sin = self.cos[positions], self.sin[positions]
        keys, values, starts, bounds = [cache.keys], [cache.values], [start], [0, count]
        if self.stack_weights:
            self.ops.stack(
                x,
                self.stack_weights,
                self.stack_bits,
                cos,
                sin,
                keys,
                values,
                starts,
                bounds,
                self.heads,
                self.kv_heads,
                self.scale,
                self.eps,
            )
        else:
            self._block(x, cos, sin, keys, values, starts, bounds)
        cache.length += count
        if self.final_norm is None:
            return x
        return self.ops.add_rms_norm(x, None, self.final_norm, self.eps, False)

    def _block(self, x, cos, sin, keys, values, starts, bounds) -> None:
        """The head's decoder block from Python, one call per op (each matmul on its own
        kernel, float32 between them), ``x`` updated in place."""
        ops = self.ops
        h = x  # read by the q|k|v matmul only, before x changes
        if self.input_norm is not None:
            h = ops.add_rms_norm(x, None, self.input_norm, self.eps, self.qkv.bf16)
        qkv = _apply(self.qkv, h)
        heads, kv_heads, scale = self.heads, self.kv_heads, self.scale
        attended = ops.rope_attend(
            qkv, cos, sin, keys, values, starts, bounds, 0, heads, kv_heads, scale, False
        )
        h = ops.add_rms_norm(x, _apply(self.out, attended), self.post_norm, self.eps, False)
        ops.add_into(x, _apply(self.down, ops.silu_mul(_apply(self.gate_up, h), False)))

    def draft_greedy(self, feature: torch.Tensor, k: int, cache: LeanCache) -> torch.Tensor | None:
        """``k`` greedy drafts (full-vocabulary ids ``[k]``) from the predicted feature
        ``feature`` ``[hidden]`` in one native call, feeding the first ``k - 1`` at
        ``cache``'s next positions (the caller rewinds them), exactly what :meth:`logits`,
        an argmax and :meth:`feed` give one at a time; ``None`` where the head is not on
        one integer kernel's tiles (then the caller drafts one at a time)."""
        fc, output = self.native
        if fc is None or output is None or not self.stack_weights:
            return None
        start = cache.length
        cache.reserve(k - 1)
        drafts = self.ops.head_draft(
            feature[None].float().contiguous(),
            k,
            self.vocab_ids,
            self.embed,
            *fc,
            self.fc_bias,
            self.stack_weights,
            self.stack_bits,
            self.final_norm,
            *output,
            self.cos,
            self.sin,
            cache.keys,
            cache.values,
            start,
            self.heads,
            self.kv_heads,
            self.scale,
            self.eps,
        )
        cache.length += k - 1
        return self.to_full(drafts)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """``[n, draft_vocab]`` float32 logits over the head's vocabulary (its reduced one,
        or the target's whole) for predicted features ``[n, hidden]``."""
        return _apply(self.output, features)

    def to_full(self, index: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary ids of positions ``index`` in :meth:`logits`'s rows."""
        return index if self.vocab_ids is None else self.vocab_ids[index]
