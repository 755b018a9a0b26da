"""A head in the eagle layout exported for vLLM computes, in vLLM's EAGLE-1 arrangement
(fc over (embedding, feature), a block without input norm, no final norm, the target's
output layer), exactly what the head computes; other heads are refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from serving.backends import UnsupportedDraftError
from serving.engine.drafters.package import DraftManifest, write_package
from serving.models.head import DraftHead, causal_mask, head_config_for, save_head
from serving.models.tiny import tiny_llama
from tasks.evaluate.eagle_export import eagle_refusal, write_eagle_draft
from tasks.evaluate.export import export_draft, load_export


@pytest.fixture
def target(tmp_path):
    model = tiny_llama(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    model.save_pretrained(tmp_path / "target")
    return model, tmp_path / "target"


def random_head(model, layout="eagle", **options):
    torch.manual_seed(0)
    size = options.get("draft_vocab_size")
    vocab_ids = None if size is None else torch.arange(size)
    head = DraftHead(head_config_for(model, layout=layout, **options), vocab_ids).eval()
    with torch.no_grad():  # norms away from 1 so that a dropped one would show
        for name, parameter in head.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return head


def vllm_eagle_forward(folder, embed, features, tokens, positions):
    """vLLM's EagleLlamaForCausalLM.forward, written out over the exported files."""
    config = LlamaConfig(**json.loads((folder / "config.json").read_text()))
    config._attn_implementation = "sdpa"
    weights = load_file(str(folder / "model.safetensors"))
    layer = LlamaDecoderLayer(config, layer_idx=0)
    layer.input_layernorm = torch.nn.Identity()  # vLLM: disable_input_layernorm on layer 0
    layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in weights.items()
                           if k.startswith("layers.0.")})  # fmt: skip
    hidden = torch.cat([embed(tokens), features], dim=-1) @ weights["fc.weight"].T
    rotary = LlamaRotaryEmbedding(config)
    mask = causal_mask(tokens.shape[1], 0)
    return layer(hidden, attention_mask=mask, position_ids=positions,
                 position_embeddings=rotary(hidden, position_ids=positions))  # fmt: skip


def test_the_export_computes_what_the_head_computes(tmp_path, target):
    model, folder = target
    head = random_head(model)
    out = write_eagle_draft(save_head(head, tmp_path / "head"), folder, tmp_path / "eagle")
    embed = model.get_input_embeddings()
    torch.manual_seed(1)
    features = torch.randn(1, 6, 64)
    tokens = torch.randint(0, model.config.vocab_size, (1, 6))
    positions = torch.arange(6)[None]
    with torch.no_grad():
        ours = head(features, embed(tokens), positions, attention_mask=causal_mask(6, 0))
        theirs = vllm_eagle_forward(out, embed, features, tokens, positions)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["architectures"] == ["LlamaForCausalLM"]
    assert "fc.bias" not in load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize(
    ("layout", "options", "reason"),
    [
        ("specops", {}, "fc layer has a bias"),
        ("specops", {}, "normalises its output"),
        ("eagle", {"draft_vocab_size": 16}, "reduced vocabulary of 16"),
    ],
)
def test_heads_vllm_cannot_reproduce_are_refused_with_the_reason(
    tmp_path, target, layout, options, reason
):
    model, folder = target
    head = random_head(model, layout, **options)
    assert reason in eagle_refusal(head.head_config)
    with pytest.raises(UnsupportedDraftError, match=reason):
        write_eagle_draft(save_head(head, tmp_path / "head"), folder, tmp_path / "eagle")
    assert not (tmp_path / "eagle").exists()


def test_a_head_package_exports_as_vllms_eagle_method(tmp_path, target):
    model, folder = target
    save_head(random_head(model), tmp_path / "pkg-src" / "head")
    package = write_package(
        tmp_path / "pkg", DraftManifest(drafter="head:head", family="head"),
        files={"head": tmp_path / "pkg-src" / "head"},
    )  # fmt: skip
    out = export_draft(package, "vllm", tmp_path / "out", k=3, target=str(folder))
    speculation = load_export(out, "vllm")
    assert speculation.method == "eagle" and speculation.num_speculative_tokens == 3
    assert (out / "draft" / "model.safetensors").is_file()
