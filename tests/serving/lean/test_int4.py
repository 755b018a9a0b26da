"""The lean step's int4 x int8 kernel: what it computes, on every path, row by row."""

from __future__ import annotations

import pytest
import torch

from serving.lean.build import load_ops
from serving.lean.int4 import adopt_tiles, int4_tiles
from serving.models.quantized import Int4Linear, unnibble


@pytest.fixture(scope="module")
def ops():
    load_ops()
    return torch.ops.specops_lean


def _layer(out_features: int, in_features: int, seed: int = 0) -> Int4Linear:
    torch.manual_seed(seed)
    return Int4Linear(torch.nn.Linear(in_features, out_features, bias=False))


def _reference(x: torch.Tensor, layer: Int4Linear) -> torch.Tensor:
    """Each row's groups of 32 rounded to int8 by their largest magnitude, times the
    dequantised weight, in float64."""
    groups = x.reshape(x.shape[0], -1, 32).double()
    largest = groups.abs().amax(-1, keepdim=True).float()
    inverse = torch.where(largest > 0, 127.0 / largest, torch.zeros_like(largest))
    codes = torch.round(groups.float() * inverse).clamp(-127, 127)
    rounded = (codes * (largest / 127.0)).reshape(x.shape).double()
    return rounded @ layer.dequantized_weight().double().t()


@pytest.mark.parametrize("shape", [(16, 32), (48, 96), (960, 576)])
def test_the_kernel_multiplies_by_int8_rounded_activations(ops, shape):
    layer = _layer(*shape)
    tiles, scales = int4_tiles(unnibble(layer.codes, layer.in_features), layer.scales_and_zeros)
    x = torch.randn(5, shape[1]) * 3
    got = ops.int4_mm(x, tiles, scales, False)
    want = _reference(x, layer)
    assert got.shape == (5, shape[0]) and got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max())
    # A bfloat16 input is read as the float32 it stands for.
    assert torch.equal(ops.int4_mm(x.bfloat16(), tiles, scales, False),
                       ops.int4_mm(x.bfloat16().float(), tiles, scales, False))  # fmt: skip


def test_the_vector_path_equals_the_plain_one_bit_for_bit_and_rows_stand_alone(ops):
    layer = _layer(192, 320, seed=1)
    tiles, scales = int4_tiles(unnibble(layer.codes, layer.in_features), layer.scales_and_zeros)
    x = torch.randn(13, 320)
    x[3] = 0.0  # a row of zeros: scale 0, output 0
    x[4, :32] = 1e-30  # a group of tiny values
    whole = ops.int4_mm(x, tiles, scales, False)
    assert torch.equal(whole, ops.int4_mm(x, tiles, scales, True)), ops.int4_path()
    assert torch.equal(whole[3], torch.zeros(192))
    for rows in range(1, 13):
        for start in (0, 13 - rows):
            part = ops.int4_mm(x[start : start + rows].contiguous(), tiles, scales, False)
            assert torch.equal(part, whole[start : start + rows]), (rows, start)


def test_a_layer_on_tiles_drops_torchs_copy_and_keeps_its_export(ops):
    layer = _layer(64, 96, seed=2)
    weight = layer.dequantized_weight()
    module = torch.nn.Sequential(layer)
    assert adopt_tiles(module) == 1 and adopt_tiles(module) == 0
    assert layer.packed.numel() == 0
    assert torch.equal(layer.dequantized_weight(), weight)
    x = torch.randn(2, 3, 96)
    with torch.inference_mode():
        out = module(x)
    assert out.shape == (2, 3, 64)
    assert torch.equal(out.reshape(6, 64), ops.int4_mm(x.reshape(6, 96), layer.tiles,
                                                       layer.tile_scales, False))  # fmt: skip


@pytest.mark.parametrize(
    ("x", "tiles", "message"),
    [
        (torch.zeros(2, 40), torch.zeros(4, 1, 256, dtype=torch.uint8), "groups times 32"),
        (torch.zeros(2, 32), torch.zeros(4, 1, 128, dtype=torch.uint8), "tiles must be"),
        (torch.zeros(2, 32, dtype=torch.int32), torch.zeros(4, 1, 256, dtype=torch.uint8),
         "x must be"),
    ],
)  # fmt: skip
def test_bad_shapes_are_named(ops, x, tiles, message):
    scales = torch.zeros(tiles.shape[0], 1, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=message):
        ops.int4_mm(x, tiles, scales, False)
