"""Fused projections (serving/models/fused.py): the fused layers keep the model's device
and dtype, and the fused forward is transformers'."""

import pytest
import torch

from serving.models.fused import fuse_projections, unfuse_projections
from serving.models.tiny import tiny_llama


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_layers_keep_the_models_dtype_and_device_and_its_logits(dtype):
    model = tiny_llama(num_layers=2).to(dtype)
    ids = torch.tensor([[1, 5, 17, 42, 8, 5]])
    with torch.inference_mode():
        want = model(input_ids=ids).logits
    assert fuse_projections(model) == 4  # two attentions, two MLPs
    fused = [model.model.layers[0].self_attn.qkv_proj, model.model.layers[0].mlp.gate_up_proj]
    for layer in fused:
        assert layer.weight.dtype == dtype
        assert layer.weight.device == model.model.embed_tokens.weight.device
    with torch.inference_mode():
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want)
    assert unfuse_projections(model) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")
def test_a_model_fused_on_the_gpu_stays_there():
    model = tiny_llama(num_layers=1).to("cuda")
    fuse_projections(model)
    assert model.model.layers[0].self_attn.qkv_proj.weight.device.type == "cuda"
