from __future__ import annotations

import pytest
import torch

from serving.engine.build import build_decoder
from serving.engine.drafters.plan import PLAIN, DraftPlan
from serving.errors import BadInputError, ModelSourceError
from serving.hardware import HardwareTarget, engine_target, hardware_target
from serving.loader import encode_prompt, load_target, set_threads
from serving.models.kernels import check_kernels
from serving.target import DEFAULT_TARGET, LoadedTarget


def test_set_threads_rejects_nonsense():
    with pytest.raises(BadInputError, match="threads must be an integer >= 1, got 0"):
        set_threads(0)


def _hardware_config(tmp_path, **targets: str):
    """A hardware.yaml of ``targets`` (each a YAML mapping's lines), and its path."""
    path = tmp_path / "hardware.yaml"
    body = "".join(
        f"  {name}:\n" + "".join(f"    {line}\n" for line in lines.split(";"))
        for name, lines in targets.items()
    )
    path.write_text("targets:\n" + body)
    return path


def test_load_target_rejects_unknown_kernels_and_missing_folders(tmp_path):
    with pytest.raises(BadInputError, match="unknown kernels 'cuda'"):
        check_kernels("cuda")
    # A hardware target naming them is refused where it is read, before any loading.
    path = _hardware_config(tmp_path, odd="kernels: cuda;verify_curve: [1.0, 1.1]")
    with pytest.raises(BadInputError, match="kernels"):
        hardware_target("odd", path)
    with pytest.raises(ModelSourceError, match="neither 'smollm2' nor a local model folder"):
        load_target(str(tmp_path / "missing"))


def test_decoder_options_are_checked_before_loading():
    with pytest.raises(BadInputError, match="unknown policy"):
        DraftPlan.parse("pld", policy="x")
    with pytest.raises(BadInputError, match="unknown hardware target"):
        engine_target("x")
    with pytest.raises(BadInputError, match="k must be between"):
        DraftPlan.parse("pld", k=0)
    assert DraftPlan.parse("none", k=0).kind.name == "none"


@pytest.mark.real_model
def test_encode_prompt_applies_the_chat_template(real_stock):
    tokenizer = real_stock.tokenizer
    chat = encode_prompt(tokenizer, "Hello")
    plain = encode_prompt(tokenizer, "Hello", chat=False)
    assert len(chat) > len(plain)
    assert tokenizer.decode(chat).rstrip().endswith("assistant")
    with pytest.raises(BadInputError, match="the prompt is empty"):
        encode_prompt(tokenizer, "  ")


def test_load_target_refuses_onednn_off_the_cpu_before_loading(tmp_path):
    curve = "verify_curve: [1.0, 1.1]"
    path = _hardware_config(
        tmp_path,
        gpu=f"device: cuda;kernels: onednn;{curve}",
        half=f"kernels: onednn;dtype: bfloat16;{curve}",
        eighth=f"kernels: stock;dtype: float8;{curve}",
        apple=f"device: mps;{curve}",
        odd=f"device: gpu0;{curve}",
    )
    # Refused where the hardware target is read, before any model is.
    with pytest.raises(BadInputError, match="kernels 'onednn' are for float32 layers on the CPU"):
        hardware_target("gpu", path)
    with pytest.raises(BadInputError, match="needs kernels 'stock'"):
        hardware_target("half", path)
    with pytest.raises(BadInputError, match="float8"):
        hardware_target("eighth", path)
    with pytest.raises(BadInputError, match="not on device 'mps'"):
        hardware_target("apple", path)
    with pytest.raises(BadInputError, match="not on device 'gpu0'"):
        hardware_target("odd", path)
    # And by the loader itself, before the source is read (no model there).
    missing = str(tmp_path / "missing")

    def unchecked(**fields) -> HardwareTarget:
        return HardwareTarget.model_construct(name="unchecked", **fields)

    with pytest.raises(BadInputError, match="kernels 'onednn' are for float32 layers on the CPU"):
        load_target(missing, unchecked(kernels="onednn", device="cuda"))
    with pytest.raises(BadInputError, match="load with kernels='stock'"):
        load_target(missing, unchecked(kernels="onednn", dtype="bfloat16"))
    with pytest.raises(BadInputError, match="not on device 'mps'"):
        load_target(missing, unchecked(kernels="stock", device="mps"))
    with pytest.raises(BadInputError, match="unknown device 'gpu0'"):
        load_target(missing, unchecked(kernels="stock", device="gpu0"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_load_target_on_cuda_without_a_gpu_names_the_device(tmp_path):
    with pytest.raises(BadInputError) as excinfo:
        load_target(str(tmp_path / "missing"), engine_target("cuda"))
    message = str(excinfo.value)
    assert "device 'cuda' was asked for, but this torch sees no CUDA GPU" in message
    assert "use device 'cpu'" in message


def test_load_target_loads_on_the_cpu_in_the_asked_dtype(model_folder):
    stock = engine_target("cpu-stock")
    target = load_target(str(model_folder), stock)
    weight = next(target.model.parameters())
    assert weight.device.type == "cpu" and weight.dtype == torch.float32  # the default
    assert (target.device.type, target.dtype, target.kernels) == ("cpu", torch.float32, "stock")
    assert target.hardware is stock and target.name == "cpu-stock"
    assert target.source == str(model_folder) and target.tokenizer is not None
    assert target.step is None  # stock kernels on the CPU: transformers' forward
    half = stock.model_copy(update={"dtype": "bfloat16"})
    target = load_target(str(model_folder), half)
    assert next(target.model.parameters()).dtype == torch.bfloat16
    assert target.dtype == torch.bfloat16


def test_load_target_defaults_to_the_shipped_target_on_the_default_hardware(monkeypatch):
    """``load_target()`` loads ``smollm2`` for hardware target ``cpu`` (no weights read
    here: the real model's loader is replaced by the tiny target's)."""
    from serving.models.tiny import tiny_llama

    monkeypatch.setattr("serving.models.real.load_real_model", lambda dtype: (tiny_llama(), None))
    target = load_target(lean_mode="off")
    assert (target.source, target.name, target.kernels) == (DEFAULT_TARGET, "cpu", "onednn")
    assert DEFAULT_TARGET == "smollm2"


def test_a_decoder_refuses_a_model_off_its_hardware_targets_device(tmp_path, target):
    path = _hardware_config(tmp_path, gpu="device: cuda;verify_curve: [1.0, 1.1]")
    on_gpu = LoadedTarget.of(target, hardware=hardware_target("gpu", path))
    with pytest.raises(BadInputError, match="the model is on cpu, but hardware target 'gpu'"):
        build_decoder(on_gpu, PLAIN)
