from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.factory import build_drafter
from serving.engine.policy import FixedK
from serving.hardware import engine_target
from serving.loader import load_target
from serving.models import quantized
from serving.models.kernels import apply_kernels
from serving.models.quantized import (
    INT4_GROUP,
    Int4Linear,
    Int8Linear,
    QuantisedKernelsUnavailable,
    check_kernels,
    dequantize_linear_layers,
    int4_codes,
    quantize_linear_layers,
)
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget
from tests.serving.models.passes import block_and_singles

LAYERS = {"int8": Int8Linear, "int4": Int4Linear}


def _linear(out_features: int, in_features: int, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features, bias=True)
    with torch.no_grad():
        linear.weight.normal_(0, 0.05)
    return linear


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_quantised_layer_approximates_its_float_layer(scheme):
    linear = _linear(96, 128)
    layer = LAYERS[scheme](linear)
    x = torch.randn(3, 7, 128)
    with torch.inference_mode():
        want, got = linear(x), layer(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    error = (got - want).abs().max() / want.abs().max()
    assert error < (0.02 if scheme == "int8" else 0.15), f"{scheme} relative error {error}"


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize(("out_features", "in_features"), [(576, 576), (960, 576), (576, 1536)])
def test_quantised_rows_do_not_depend_on_how_many_share_the_call(scheme, out_features, in_features):
    layer = LAYERS[scheme](_linear(out_features, in_features))
    rows = torch.randn(16, in_features)
    with torch.inference_mode():
        alone = torch.cat([layer(rows[i : i + 1]) for i in range(16)])
        for count in range(2, 17):
            assert torch.equal(layer(rows[:count]), alone[:count]), f"{count} rows"


def test_int4_codes_recover_q4_1_codes_exactly():
    # A GGUF Q4_1 block: w = d * q + m with q spanning 0..15 in every block of 32.
    torch.manual_seed(1)
    codes = torch.randint(0, 16, (16, 64), dtype=torch.int32)
    codes[:, 0], codes[:, 1], codes[:, 32], codes[:, 33] = 0, 15, 0, 15
    d = torch.rand(16, 2).half().float() * 0.1 + 0.01
    m = -torch.rand(16, 2).half().float()
    weight = (codes.reshape(16, 2, 32) * d[..., None] + m[..., None]).reshape(16, 64)
    got, scale, low = int4_codes(weight)
    assert torch.equal(got, codes)
    torch.testing.assert_close(low, m)
    torch.testing.assert_close(scale, d, rtol=1e-6, atol=0)


def test_a_layer_the_kernel_cannot_shape_stays_float():
    model = torch.nn.Sequential(torch.nn.Linear(48, 32), torch.nn.Linear(64, 40))
    quantize_linear_layers(model, "int4", fuse=False)
    assert type(model[0]) is torch.nn.Linear  # 48 inputs: not whole groups of 32
    assert type(model[1]) is torch.nn.Linear  # 40 outputs: not a multiple of 16
    with pytest.raises(Exception, match=f"multiple of {INT4_GROUP}"):
        Int4Linear(torch.nn.Linear(48, 32))


def _plain(model: PreTrainedModel, prompt, new_tokens=40):
    """``model``'s greedy output, taken as it is (no end-of-sequence ids)."""
    decoder = SpeculativeDecoder(LoadedTarget.of(model))
    return decoder.generate(prompt, max_new_tokens=new_tokens).token_ids


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_verification_pass_computes_what_one_token_passes_compute(scheme, prompt):
    model = tiny_llama()
    apply_kernels(model, scheme)
    ids = torch.tensor([prompt])
    for rows in (2, 3, 5, 9):
        block, singles = block_and_singles(model, ids, rows)
        assert torch.equal(block, singles), f"{rows} rows"


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("spec", ["pld", "layers:2"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_speculative_output_equals_plain_output_on_a_quantised_target(scheme, spec, k, prompt):
    model = tiny_llama()
    apply_kernels(model, scheme)
    reference = _plain(model, prompt)
    target = LoadedTarget.of(model)
    assert target.kernels == scheme
    drafter = build_drafter(spec, target)
    decoder = SpeculativeDecoder(target, drafter=drafter, policy=FixedK(k))
    assert decoder.generate(prompt, max_new_tokens=40).token_ids == reference


def _codes(model) -> dict[str, torch.Tensor]:
    return {name: buffer.clone() for name, buffer in model.named_buffers() if "packed" not in name}


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantised_weights_round_trip_through_a_saved_model(scheme, tmp_path, prompt):
    model = tiny_llama()
    quantize_linear_layers(model, scheme)
    codes, output = _codes(model), _plain(model, prompt)
    assert dequantize_linear_layers(model) > 0
    assert not hasattr(model.model.layers[0].self_attn, "qkv_proj")  # unfused for export
    model.save_pretrained(tmp_path / "draft")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "draft").eval()
    quantize_linear_layers(again, scheme)
    assert _codes(again).keys() == codes.keys()
    for name, value in _codes(again).items():
        assert torch.equal(value, codes[name]), name
    assert _plain(again, prompt) == output


def test_fused_layers_hold_the_codes_of_the_separate_layers():
    separate, fused = tiny_llama(), tiny_llama()
    quantize_linear_layers(separate, "int4", fuse=False)
    quantize_linear_layers(fused, "int4", fuse=True)
    attention_a, attention_b = separate.model.layers[0].self_attn, fused.model.layers[0].self_attn
    stacked = torch.cat([getattr(attention_a, n).codes for n in ("q_proj", "k_proj", "v_proj")])
    assert torch.equal(attention_b.qkv_proj.codes, stacked)


def test_missing_cpu_features_are_named_before_any_model_work(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    with pytest.raises(QuantisedKernelsUnavailable, match="AVX2 or AVX-512"):
        check_kernels("int4")
    with pytest.raises(QuantisedKernelsUnavailable, match="AVX2 or AVX-512"):
        load_target(str(tmp_path / "no-model-here"), engine_target("cpu-int8"))


def test_a_torch_without_the_kernels_is_told_how_to_install_them(monkeypatch):
    def missing(scheme):
        raise RuntimeError("no such op: aten::_weight_int4pack_mm_for_cpu")

    monkeypatch.setattr(quantized, "_probe", missing)
    with pytest.raises(QuantisedKernelsUnavailable, match=r"install torch>=2\.6"):
        check_kernels("int4")
    with pytest.raises(Exception, match="unknown quantisation scheme 'int3'"):
        check_kernels("int3")
