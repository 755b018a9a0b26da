"""The lean step's attention op (serving/lean/attend.cpp) on its own: softmax attention as
torch computes it, each row of a pass bit for bit its one-row pass, on the head widths the
op specialises (64, 128) and others (a multiple of the vector width or not), across
key-block boundaries."""

from __future__ import annotations

import pytest
import torch

from serving.lean.build import load_ops
from serving.lean.cache import LeanCache


def _rotary(positions: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    inverse = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    angles = torch.outer(torch.arange(positions).float(), inverse)
    return angles.cos().contiguous(), angles.sin().contiguous()


def _attend(ops, cache, qkv, cos, sin, start, heads, kv_heads, layer=1):
    rows = qkv.shape[0]
    cache.reserve(rows)
    out = ops.rope_attend(
        qkv, cos[start : start + rows].contiguous(), sin[start : start + rows].contiguous(),
        [cache.keys], [cache.values], [start], [0, rows], layer, heads, kv_heads,
        cache.values.shape[-1] ** -0.5, False,
    )  # fmt: skip
    cache.length = start + rows
    return out


def _reference(qkv_all, cos, sin, heads, kv_heads, d):
    """Causal softmax attention over every row so far, in float64."""
    n = qkv_all.shape[0]
    q, k, v = qkv_all.double().split([heads * d, kv_heads * d, kv_heads * d], dim=1)

    def rotate(x, count):
        x = x.view(n, count, d)
        a, b = x[..., : d // 2], x[..., d // 2 :]
        c, s = cos[:n, None].double(), sin[:n, None].double()
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    q, k = rotate(q, heads), rotate(k, kv_heads)
    v = v.view(n, kv_heads, d)
    group = heads // kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * d**-0.5
    scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * d)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d"), [(9, 3, 64), (4, 2, 128), (6, 2, 48), (4, 2, 8), (2, 1, 18)]
)
def test_rows_of_a_pass_equal_their_one_row_passes_and_torch_attention(heads, kv_heads, d):
    load_ops()
    ops = torch.ops.specops_lean
    width = (heads + 2 * kv_heads) * d
    generator = torch.Generator().manual_seed(d)
    qkv = torch.randn(60, width, generator=generator)
    cos, sin = _rotary(64, d)
    context = 27  # the passes cross the key blocks at 32 and 48
    cache = LeanCache(2, kv_heads, d, limit=64)
    _attend(ops, cache, qkv[:context], cos, sin, 0, heads, kv_heads)
    singles = [
        _attend(
            ops, cache, qkv[context + i : context + i + 1], cos, sin, context + i, heads, kv_heads
        )
        for i in range(16)
    ]
    want = torch.cat(singles)
    for rows in (2, 3, 5, 8, 13, 16):
        cache.length = context
        block = _attend(
            ops, cache, qkv[context : context + rows], cos, sin, context, heads, kv_heads
        )
        assert torch.equal(block, want[:rows]), f"a {rows}-row pass"
    reference = _reference(qkv[: context + 16], cos, sin, heads, kv_heads, d)[context:]
    assert (want.double() - reference).abs().max() < 1e-5 * reference.abs().max()


def test_an_odd_head_width_is_refused_by_name():
    load_ops()
    cache = LeanCache(1, 1, 7, limit=32)
    with pytest.raises(RuntimeError, match="head width must be even"):
        torch.ops.specops_lean.rope_attend(
            torch.zeros(1, 3 * 7), torch.zeros(1, 3), torch.zeros(1, 3),
            [cache.keys], [cache.values], [0], [0, 1], 0, 1, 1, 1.0, False,
        )  # fmt: skip
