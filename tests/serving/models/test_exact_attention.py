from __future__ import annotations

import pytest
import torch

from serving.models.exact_attention import IMPLEMENTATION, use_exact_attention
from serving.models.kernels import apply_kernels
from serving.models.onednn import PackedLinear, onednn_available
from serving.models.tiny import tiny_llama
from tests.serving.models.passes import block_and_singles


@pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")
def test_every_row_of_a_block_is_what_a_one_token_pass_computes():
    # Stock (MKL) linear layers are not batch-invariant; the packed ones are, and the
    # kernels that pack them switch attention to the exact kind.
    model = tiny_llama(hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128)
    apply_kernels(model, "onednn")
    assert model.config._attn_implementation == IMPLEMENTATION
    ids = torch.randint(3, 96, (1, 120))
    for rows in (2, 4, 7, 16):
        block, singles = block_and_singles(model, ids, rows)
        assert torch.equal(block, singles), f"{rows} rows"


def test_a_prefill_keeps_transformers_attention():
    model, reference = tiny_llama(), tiny_llama()
    use_exact_attention(model)
    ids = torch.randint(3, 96, (1, 30))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits)


@pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")
def test_wide_packed_layers_are_batch_invariant():
    # oneDNN alone reduces 1536 inputs differently for one row than for several.
    torch.manual_seed(0)
    layer = PackedLinear(torch.nn.Linear(1536, 576, bias=True))
    rows = torch.randn(16, 1536)
    with torch.inference_mode():
        alone = torch.cat([layer(rows[i : i + 1]) for i in range(16)])
        for count in range(2, 17):
            assert torch.equal(layer(rows[:count]), alone[:count]), f"{count} rows"
