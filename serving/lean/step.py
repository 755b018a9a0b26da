"""The lean decode step: a Llama-family target's forward without the framework's per-module
Python, over the weights the target's kernels already packed.

Per layer it makes eight calls: the four matmuls (the integer kernels of ``int4.cpp`` and
``int8.cpp`` for int4 and int8 targets, oneDNN's for float32), and three fused ops of
``ops.cpp`` — the residual add with the next RMSNorm, rotary embeddings with the KV write
and attention, and SiLU-times-up. Everything stays float32 between them (the integer
kernels round each row's activations to int8 themselves); a quantised target's layers run
in one call (``ops.stack``).

Exactness: every one of those calls computes a row the same way whatever the number of
rows beside it (the packed matmuls are batch-invariant, tested; the fused ops are written
so), so a verification pass gives each position bit for bit what a one-token pass gives,
and a packed pass over several sequences gives each what it would get alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from serving.errors import SpecOpsError
from serving.lean.build import load_ops
from serving.lean.cache import LeanCache
from serving.lean.tiles import adopt_tiles
from serving.models.kernels import kernels_of

Matmul = Callable[[torch.Tensor], torch.Tensor]
_BF16 = torch.bfloat16


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the lean step cannot run ``model`` (``None`` when it can): the layout it knows
    is transformers' Llama family with fused projections (serving.models.fused) on a CPU
    float32 model whose linear layers a CPU kernel family packed."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) != "llama":
        return (
            f"architecture {getattr(config, 'model_type', type(model).__name__)!r} is not Llama's"
        )
    if kernels_of(model) not in ("onednn", "int8", "int4"):
        return "its linear layers are not packed for the CPU (kernels onednn, int8 or int4)"
    parameter = next(model.parameters())
    if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
        return f"it runs on {parameter.device.type} in {parameter.dtype}, not the CPU in float32"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "its projections have biases"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"its rotary embeddings are {rope['rope_type']!r}, not default"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not layers:
        return "it has no decoder layers where Llama keeps them (model.model.layers)"
    first = layers[0]
    if not hasattr(first.self_attn, "qkv_proj") or not hasattr(first.mlp, "gate_up_proj"):
        return "its projections are not fused (serving.models.fused)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its activation is {config.hidden_act!r}, not silu"
    return None


def matmul_of(linear: Any) -> tuple[Matmul, bool]:
    """A closure computing ``linear`` on a ``[rows, in]`` input, and whether it takes
    bfloat16 (the quantised kernels) rather than float32 (oneDNN)."""
    from serving.models.onednn import PackedLinear
    from serving.models.quantized import Int4Linear, Int8Linear

    if isinstance(linear, Int4Linear):
        tiles, scales = linear.tiles, linear.tile_scales
        if tiles is None:
            raise SpecOpsError("an int4 layer the lean step runs must be on its tiles first")
        int4 = torch.ops.specops_lean.int4_mm
        return (lambda x: int4(x, tiles, scales, False)), False
    if isinstance(linear, Int8Linear) and linear.tiles is not None:
        tiles8, scales8 = linear.tiles, linear.tile_scales
        int8_tiles = torch.ops.specops_lean.int8_mm
        return (lambda x: int8_tiles(x, tiles8, scales8, False)), False
    if isinstance(linear, Int8Linear):  # a shape the integer kernel does not take
        codes, scale = linear.codes, linear.scale
        int8 = torch.ops.aten._weight_int8pack_mm
        return (lambda x: int8(x, codes, scale)), True
    if isinstance(linear, PackedLinear):
        onednn = torch.ops.mkldnn._linear_pointwise
        slices = list(zip(linear.bounds, linear.packed_weights, strict=True))
        if len(slices) == 1:
            weight = slices[0][1]
            return (lambda x: onednn(x, weight, None, "none", [], "")), False

        def sliced(x: torch.Tensor) -> torch.Tensor:
            out = None
            for (a, b), weight in slices:
                part = onednn(x[:, a:b].contiguous(), weight, None, "none", [], "")
                out = part if out is None else out + part
            assert out is not None
            return out

        return sliced, False
    raise SpecOpsError(f"the lean step has no kernel for {type(linear).__name__}")


def stack_weights_of(decoder: list[Any]) -> tuple[int, list[torch.Tensor]]:
    """The tensors ``ops.stack`` takes when every projection of ``decoder`` is on one of
    torch's quantised kernels (``(bits, [])`` otherwise: the stack runs from Python)."""
    from serving.models.quantized import Int4Linear, Int8Linear

    weights: list[torch.Tensor] = []
    kinds: set[type] = set()
    for layer in decoder:
        attention, mlp = layer.self_attn, layer.mlp
        weights.append(layer.input_layernorm.weight.detach())
        for linear in (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj):
            kinds.add(type(linear))
            if isinstance(linear, Int4Linear):
                assert linear.tiles is not None and linear.tile_scales is not None
                weights += [linear.tiles, linear.tile_scales]
            elif isinstance(linear, Int8Linear) and linear.tiles is not None:
                assert linear.tile_scales is not None
                weights += [linear.tiles, linear.tile_scales]
            else:
                kinds.add(object)  # not on an integer kernel: the Python stack runs it
            if linear.bias is not None:
                kinds.add(object)  # a bias: the Python stack adds it
        weights.append(layer.post_attention_layernorm.weight.detach())
    if kinds == {Int4Linear}:
        return 4, weights
    if kinds == {Int8Linear}:
        return 8, weights
    return 0, []


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: Matmul
    out: Matmul
    post_norm: torch.Tensor
    gate_up: Matmul
    down: Matmul


@dataclass(frozen=True)
class LeanOutput:
    logits: torch.Tensor  # [rows kept, vocab] float32
    hidden: torch.Tensor | None  # [rows, hidden] after the final norm, where asked for


class LeanStep:
    """The forward of ``model`` (see :func:`unsupported_reason`) over its own weights; the
    model keeps them (nothing is copied)."""

    cache_type = LeanCache

    def __init__(self, model: PreTrainedModel) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise SpecOpsError(f"the lean step cannot run this model: {reason}")
        load_ops()
        adopt_tiles(model)
        self.ops = torch.ops.specops_lean
        config = model.config
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.scale = self.head_dim**-0.5
        self.limit = int(config.max_position_embeddings)
        inner = model.model  # type: ignore[attr-defined]
        decoder = list(inner.layers)
        self.layers: list[_Layer] = []
        kinds: set[bool] = set()
        self.stack_bits, self.stack_weights = stack_weights_of(decoder)
        for layer in decoder:
            attention, mlp = layer.self_attn, layer.mlp
            matmuls = [matmul_of(m) for m in (attention.qkv_proj, attention.o_proj)]
            matmuls += [matmul_of(m) for m in (mlp.gate_up_proj, mlp.down_proj)]
            kinds.update(bf16 for _, bf16 in matmuls)
            self.layers.append(
                _Layer(
                    input_norm=layer.input_layernorm.weight.detach(),
                    qkv=matmuls[0][0],
                    out=matmuls[1][0],
                    post_norm=layer.post_attention_layernorm.weight.detach(),
                    gate_up=matmuls[2][0],
                    down=matmuls[3][0],
                )
            )
        self.head, head_bf16 = matmul_of(model.get_output_embeddings())  # type: ignore[operator]
        if len(kinds) != 1:
            raise SpecOpsError("the lean step needs every decoder layer on one kernel family")
        self.bf16 = kinds.pop()
        self.head_bf16 = head_bf16
        self.embed = inner.embed_tokens.weight.detach()
        self.final_norm = inner.norm.weight.detach()
        rotary = inner.rotary_emb
        positions = torch.arange(self.limit, dtype=torch.float32)
        angles = torch.outer(positions, rotary.inv_freq.float())  # [limit, head_dim / 2]
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        self.cos = (angles.cos() * scaling).contiguous()
        self.sin = (angles.sin() * scaling).contiguous()

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.layers), self.kv_heads, self.head_dim, limit=self.limit)

    def forward(
        self,
        ids: torch.Tensor,
        caches: Sequence[LeanCache],
        rows: Sequence[int],
        *,
        keep: int = 0,
        want_hidden: bool = False,
    ) -> LeanOutput:
        """One pass: ``ids`` ``[N]`` packs ``rows[s]`` tokens for each ``caches[s]`` (in
        order), each extending its own cache. Returns the logits of the last ``keep`` rows
        (all when 0) and, if ``want_hidden``, every row's final hidden state. Call under
        ``torch.inference_mode()``; on error the caches keep their lengths."""
        if len(caches) != len(rows) or sum(rows) != ids.shape[0]:
            raise SpecOpsError(
                f"{len(caches)} caches for row counts {list(rows)} of {ids.shape[0]}"
            )
        starts = [cache.length for cache in caches]
        bounds = [0]
        for cache, count in zip(caches, rows, strict=True):
            cache.reserve(count)
            bounds.append(bounds[-1] + count)
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, rows, strict=True)])
        cos, sin = self.cos[positions], self.sin[positions]  # [N, head_dim / 2]
        keys = [cache.keys for cache in caches]
        values = [cache.values for cache in caches]
        x = self.embed[ids]  # [N, hidden] float32, this pass's own residual stream
        if self.stack_weights:  # the quantised kernels: every layer in one call
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
            self._layers(x, cos, sin, keys, values, starts, bounds)
        rows_out = x if want_hidden or keep <= 0 else x[-keep:].contiguous()
        normed = self.ops.add_rms_norm(rows_out, None, self.final_norm, self.eps, False)
        final = normed[-keep:] if want_hidden and keep > 0 else normed
        logits = self.head(final.to(_BF16) if self.head_bf16 else final).float()
        for cache, count in zip(caches, rows, strict=True):
            cache.length += count
        return LeanOutput(logits=logits, hidden=normed if want_hidden else None)

    def _layers(self, x, cos, sin, keys, values, starts, bounds) -> None:
        """The decoder stack from Python, one call per op (oneDNN's float32 kernels)."""
        ops, bf16 = self.ops, self.bf16
        h = ops.add_rms_norm(x, None, self.layers[0].input_norm, self.eps, bf16)
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            attended = ops.rope_attend(
                layer.qkv(h),
                cos,
                sin,
                keys,
                values,
                starts,
                bounds,
                index,
                self.heads,
                self.kv_heads,
                self.scale,
                bf16,
            )
            h = ops.add_rms_norm(x, layer.out(attended), layer.post_norm, self.eps, bf16)
            down = layer.down(ops.silu_mul(layer.gate_up(h), bf16))
            if index < last:
                h = ops.add_rms_norm(x, down, self.layers[index + 1].input_norm, self.eps, bf16)
            else:
                ops.add_into(x, down)
