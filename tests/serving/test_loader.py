from __future__ import annotations

import pytest
import torch

from serving import loader
from serving.errors import BadInputError, ModelSourceError
from serving.loader import (
    DecoderOptions,
    build_decoder,
    encode_prompt,
    load_target,
    set_threads,
)


def test_set_threads_rejects_nonsense():
    with pytest.raises(BadInputError, match="threads must be an integer >= 1, got 0"):
        set_threads(0)


def test_load_target_rejects_unknown_kernels_and_missing_folders(tmp_path):
    with pytest.raises(BadInputError, match="unknown kernels 'cuda'"):
        load_target(kernels="cuda")
    with pytest.raises(ModelSourceError, match="neither 'smollm2' nor a local model folder"):
        load_target(str(tmp_path / "missing"))


def test_decoder_options_are_checked_before_loading():
    with pytest.raises(BadInputError, match="unknown policy"):
        DecoderOptions(policy="x").check()
    with pytest.raises(BadInputError, match="unknown hardware target"):
        DecoderOptions(hardware="x").check()
    with pytest.raises(BadInputError, match="k must be between"):
        DecoderOptions(k=0).check()
    assert DecoderOptions(drafter="none", k=0).check().kind == "none"


@pytest.mark.real_model
def test_encode_prompt_applies_the_chat_template(real_stock):
    _, tokenizer = real_stock
    chat = encode_prompt(tokenizer, "Hello")
    plain = encode_prompt(tokenizer, "Hello", chat=False)
    assert len(chat) > len(plain)
    assert tokenizer.decode(chat).rstrip().endswith("assistant")
    with pytest.raises(BadInputError, match="the prompt is empty"):
        encode_prompt(tokenizer, "  ")


def test_load_target_refuses_onednn_off_the_cpu_before_loading(tmp_path):
    missing = str(tmp_path / "missing")  # checked before the source: no model is read
    with pytest.raises(BadInputError, match="kernels 'onednn' are for float32 layers on the CPU"):
        load_target(missing, kernels="onednn", device="cuda")
    with pytest.raises(BadInputError, match="load with kernels='stock'"):
        load_target(missing, kernels="onednn", dtype="bfloat16")
    with pytest.raises(BadInputError, match="unknown dtype 'float8'"):
        load_target(missing, kernels="stock", dtype="float8")
    with pytest.raises(BadInputError, match="not on device 'mps'"):
        load_target(missing, kernels="stock", device="mps")
    with pytest.raises(BadInputError, match="unknown device 'gpu0'"):
        load_target(missing, kernels="stock", device="gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_load_target_on_cuda_without_a_gpu_names_the_device(tmp_path):
    with pytest.raises(BadInputError) as excinfo:
        load_target(str(tmp_path / "missing"), kernels="stock", device="cuda")
    message = str(excinfo.value)
    assert "device 'cuda' was asked for, but this torch sees no CUDA GPU" in message
    assert "use device 'cpu'" in message


def test_load_target_loads_on_the_cpu_in_the_asked_dtype(model_folder):
    model, _ = load_target(str(model_folder), kernels="stock")
    weight = next(model.parameters())
    assert weight.device.type == "cpu" and weight.dtype == torch.float32  # the default
    model, _ = load_target(str(model_folder), kernels="stock", device="cpu", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_a_decoder_refuses_a_model_off_its_hardware_targets_device(tmp_path, target, monkeypatch):
    path = tmp_path / "hardware.yaml"
    path.write_text("targets:\n  gpu:\n    device: cuda\n    verify_curve: [1.0, 1.1]\n")
    original = loader.engine_target
    monkeypatch.setattr(loader, "engine_target", lambda name, **kw: original(name, path, **kw))
    with pytest.raises(BadInputError, match="the model is on cpu, but hardware target 'gpu'"):
        build_decoder(target, None, DecoderOptions(drafter="none", hardware="gpu"))
