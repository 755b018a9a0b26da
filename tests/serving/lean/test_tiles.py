"""The lean step's integer kernels (int4 x int8, int8 x int8): what they compute, on every
path, row by row."""

from __future__ import annotations

import pytest
import torch

from serving.lean.build import load_ops
from serving.lean.tiles import adopt_tiles, int4_tiles, int8_tiles
from serving.models.quantized import Int4Linear, Int8Linear, unnibble

LAYERS = {"int4": Int4Linear, "int8": Int8Linear}


@pytest.fixture(scope="module")
def ops():
    load_ops()
    return torch.ops.specops_lean


def _layer(scheme: str, out_features: int, in_features: int, seed: int = 0):
    torch.manual_seed(seed)
    return LAYERS[scheme](torch.nn.Linear(in_features, out_features, bias=False))


def _tiles(layer):
    if isinstance(layer, Int4Linear):
        return int4_tiles(unnibble(layer.codes, layer.in_features), layer.scales_and_zeros)
    return int8_tiles(layer.codes, layer.scale)


def _mm(ops, layer, x, tiles, scales, plain=False):
    kernel = ops.int4_mm if isinstance(layer, Int4Linear) else ops.int8_mm
    return kernel(x, tiles, scales, plain)


def _reference(x: torch.Tensor, layer) -> torch.Tensor:
    """Each row's groups of 32 rounded to int8 by their largest magnitude, times the
    dequantised weight, in float64."""
    groups = x.reshape(x.shape[0], -1, 32).double()
    largest = groups.abs().amax(-1, keepdim=True).float()
    inverse = torch.where(largest > 0, 127.0 / largest, torch.zeros_like(largest))
    codes = torch.round(groups.float() * inverse).clamp(-127, 127)
    rounded = (codes * (largest / 127.0)).reshape(x.shape).double()
    return rounded @ layer.dequantized_weight().double().t()


@pytest.mark.parametrize("scheme", ["int4", "int8"])
@pytest.mark.parametrize("shape", [(16, 32), (48, 96), (960, 576)])
def test_the_kernel_multiplies_by_int8_rounded_activations(ops, scheme, shape):
    layer = _layer(scheme, *shape)
    tiles, scales = _tiles(layer)
    x = torch.randn(5, shape[1]) * 3
    got = _mm(ops, layer, x, tiles, scales)
    want = _reference(x, layer)
    assert got.shape == (5, shape[0]) and got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max())
    # A bfloat16 input is read as the float32 it stands for.
    assert torch.equal(_mm(ops, layer, x.bfloat16(), tiles, scales),
                       _mm(ops, layer, x.bfloat16().float(), tiles, scales))  # fmt: skip


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_the_vector_path_equals_the_plain_one_bit_for_bit_and_rows_stand_alone(ops, scheme):
    layer = _layer(scheme, 192, 320, seed=1)
    tiles, scales = _tiles(layer)
    x = torch.randn(13, 320)
    x[3] = 0.0  # a row of zeros: scale 0, output 0
    x[4, :32] = 1e-30  # a group of tiny values
    whole = _mm(ops, layer, x, tiles, scales)
    assert torch.equal(whole, _mm(ops, layer, x, tiles, scales, plain=True)), ops.int4_path()
    assert torch.equal(whole[3], torch.zeros(192))
    for rows in range(1, 13):
        for start in (0, 13 - rows):
            part = _mm(ops, layer, x[start : start + rows].contiguous(), tiles, scales)
            assert torch.equal(part, whole[start : start + rows]), (rows, start)


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_a_layer_on_tiles_computes_with_them_and_keeps_its_export(ops, scheme):
    layer = _layer(scheme, 64, 96, seed=2)
    weight = layer.dequantized_weight()
    module = torch.nn.Sequential(layer)
    assert adopt_tiles(module) == 1 and adopt_tiles(module) == 0
    if scheme == "int4":
        assert layer.packed.numel() == 0  # torch's copy dropped
    else:
        assert layer.codes.numel() == 0  # the tiles are the one copy
    assert torch.equal(layer.dequantized_weight(), weight)
    x = torch.randn(2, 3, 96)
    with torch.inference_mode():
        out = module(x)
    assert out.shape == (2, 3, 64)
    want = _mm(ops, layer, x.reshape(6, 96), layer.tiles, layer.tile_scales)
    assert torch.equal(out.reshape(6, 64), want)


def test_a_shape_the_kernels_do_not_take_stays_on_torchs(ops):
    layer = _layer("int8", 10, 96)  # 10 outputs: not a whole tile
    assert adopt_tiles(torch.nn.Sequential(layer)) == 0 and layer.tiles is None


@pytest.mark.parametrize(
    ("kernel", "x", "tiles", "message"),
    [
        ("int4_mm", torch.zeros(2, 40), torch.zeros(4, 1, 256, dtype=torch.uint8),
         "groups times 32"),
        ("int4_mm", torch.zeros(2, 32), torch.zeros(4, 1, 128, dtype=torch.uint8),
         "tiles must be"),
        ("int4_mm", torch.zeros(2, 32, dtype=torch.int32),
         torch.zeros(4, 1, 256, dtype=torch.uint8), "x must be"),
        ("int8_mm", torch.zeros(2, 32), torch.zeros(4, 1, 256, dtype=torch.int8),
         "int8 tiles must be"),
    ],
)  # fmt: skip
def test_bad_shapes_are_named(ops, kernel, x, tiles, message):
    if kernel == "int4_mm":
        scales = torch.zeros(tiles.shape[0], 1, 2, 16, dtype=torch.bfloat16)
    else:
        scales = torch.zeros(tiles.shape[0] * 16)
    with pytest.raises(RuntimeError, match=message):
        getattr(ops, kernel)(x, tiles, scales, False)
