from __future__ import annotations

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.models.onednn import PackedLinear, onednn_available, pack_linear_layers
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget

pytestmark = pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")


def test_packed_linear_matches_linear():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=True)
    packed = PackedLinear(linear)
    x = torch.randn(2, 5, 64)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-4, atol=1e-5)


def test_packed_rows_do_not_depend_on_how_many_share_the_call():
    torch.manual_seed(0)
    packed = PackedLinear(torch.nn.Linear(576, 300, bias=False))
    row = torch.randn(1, 576)
    with torch.inference_mode():
        alone = packed(row)
        for rows in (2, 3, 5, 8):
            together = packed(torch.cat([row, torch.randn(rows - 1, 576)]))
            assert torch.equal(together[:1], alone)


def test_pack_replaces_every_linear_and_keeps_greedy_output():
    stock = tiny_llama()
    packed = tiny_llama()
    replaced = pack_linear_layers(packed)
    assert replaced == sum(isinstance(m, torch.nn.Linear) for m in stock.modules())
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    prompt = list(range(3, 20))
    expected = SpeculativeDecoder(LoadedTarget.of(stock)).generate(prompt, max_new_tokens=32)
    got = SpeculativeDecoder(LoadedTarget.of(packed)).generate(prompt, max_new_tokens=32)
    assert got.token_ids == expected.token_ids


def test_a_linear_subclass_such_as_a_quantised_layer_is_not_packed():
    class Quantised(torch.nn.Linear):  # bitsandbytes' Linear8bitLt / Linear4bit are subclasses
        pass

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), Quantised(8, 8))
    assert pack_linear_layers(model) == 1
    assert isinstance(model[0], PackedLinear) and type(model[1]) is Quantised
