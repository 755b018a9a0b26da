"""The quantised layers' weights in the layouts of the lean step's integer kernels
(``int4.cpp``, ``int8.cpp``).

The kernels multiply int4 or int8 codes by int8-rounded activations with integer dot
products (llama.cpp's Q4_1 x Q8_1 and Q8_0 x Q8_0: each row's groups of 32 inputs get their
own scale), so a pass reads every weight once whatever its rows, and a row's result does
not depend on them. torch's ``_weight_int4pack_mm_for_cpu`` and ``_weight_int8pack_mm``
take bfloat16 activations and cost nearly as much per row as per pass (docs/lean.md).

Once a target has the lean step, its :class:`~serving.models.quantized.Int4Linear` and
:class:`~serving.models.quantized.Int8Linear` layers hand their codes to these layouts
(torch's packed int4 copy is dropped), so transformers' forward (drafts off the lean cache,
teacher-forced passes) computes what the lean step computes.
"""

from __future__ import annotations

import torch

from serving.models.quantized import INT4_GROUP, Int4Linear, Int8Linear, unnibble

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


def int8_tiles(codes: torch.Tensor, scale: torch.Tensor):
    """``codes`` ``[N, K]`` int8 and ``scale`` ``[N]`` as Int8Linear keeps them -> ``(tiles
    [N / 16, K / 32, 512] int8, scales [N] float32)``: per (tile, group) eight 64-byte
    blocks, ``V_k[4 i + b] = codes[16 t + i, 32 g + 4 k + b]``."""
    n, k = codes.shape
    tiles, groups = n // TILE, k // INT4_GROUP
    v = codes.reshape(tiles, TILE, groups, 8, 4).permute(0, 2, 3, 1, 4)  # [T, G, 8, 16, 4]
    return v.reshape(tiles, groups, 8 * TILE * 4).contiguous(), scale.float().contiguous()


def tileable(layer: Int4Linear | Int8Linear) -> bool:
    """The kernels' shapes: whole tiles of 16 outputs and groups of 32 inputs."""
    return layer.out_features % TILE == 0 and layer.in_features % INT4_GROUP == 0


def adopt_tiles(model: torch.nn.Module) -> int:
    """Move every quantised layer of ``model`` the integer kernels can shape onto them (see
    the module doc); return how many. The lean ops must be loaded."""
    moved = 0
    for module in model.modules():
        if not isinstance(module, Int4Linear | Int8Linear) or module.tiles is not None:
            continue
        if not tileable(module):
            continue
        if isinstance(module, Int4Linear):
            codes = unnibble(module.codes, module.in_features)
            module.use_tiles(*int4_tiles(codes, module.scales_and_zeros))
        else:
            module.use_tiles(*int8_tiles(module.codes, module.scale))
        moved += 1
    return moved
