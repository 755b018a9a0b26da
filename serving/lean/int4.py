"""The int4 layers' weights in the layout of the lean step's integer kernel (``int4.cpp``).

The kernel multiplies the int4 codes by int8-rounded activations with integer dot products
(llama.cpp's Q4_1 x Q8_1: each row's groups of 32 inputs get their own scale), so a pass
reads every weight once whatever its rows, and a row's result does not depend on them.
torch's ``_weight_int4pack_mm_for_cpu`` takes bfloat16 activations and costs nearly as
much per row as per pass (docs/lean.md).

Once a target has the lean step, its :class:`~serving.models.quantized.Int4Linear` layers
hand their codes to this layout and drop torch's packed copy, so transformers' forward
(drafts off the lean cache, teacher-forced passes) computes what the lean step computes.
"""

from __future__ import annotations

import torch

from serving.models.quantized import INT4_GROUP, Int4Linear, unnibble

TILE = 16  # outputs per tile: the kernel's 16 float32 lanes (two halves of 8 on AVX2)


def int4_tiles(codes: torch.Tensor, scales_and_zeros: torch.Tensor):
    """``codes`` ``[N, K]`` (0..15) and ``scales_and_zeros`` ``[K / 32, N, 2]`` bfloat16 as
    Int4Linear keeps them -> ``(tiles [N / 16, K / 32, 256] uint8, scales [N / 16, K / 32,
    2, 16] bfloat16)``: per (tile, group) four 64-byte blocks, block p's byte j holding
    ``V_p[j]`` in its low nibble and ``V_{p+4}[j]`` in its high one, where ``V_k[4 i + b] =
    codes[16 t + i, 32 g + 4 k + b]``; then the tile's 16 scales and 16 zeros."""
    n, k = codes.shape
    tiles, groups = n // TILE, k // INT4_GROUP
    v = codes.reshape(tiles, TILE, groups, 8, 4).permute(0, 2, 3, 1, 4)  # [T, G, 8, 16, 4]
    v = v.reshape(tiles, groups, 8, TILE * 4).to(torch.uint8)
    packed = (v[:, :, :4] | (v[:, :, 4:] << 4)).reshape(tiles, groups, 256).contiguous()
    sz = scales_and_zeros.reshape(groups, tiles, TILE, 2).permute(1, 0, 3, 2)  # [T, G, 2, 16]
    return packed, sz.to(torch.bfloat16).contiguous()


def adopt_tiles(model: torch.nn.Module) -> int:
    """Move every Int4Linear of ``model`` onto the integer kernel (see the module doc);
    return how many. The lean ops must be loaded."""
    moved = 0
    for module in model.modules():
        if isinstance(module, Int4Linear) and module.tiles is None:
            codes = unnibble(module.codes, module.in_features)
            module.use_tiles(*int4_tiles(codes, module.scales_and_zeros))
            moved += 1
    return moved
