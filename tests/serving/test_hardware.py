from __future__ import annotations

import itertools

import pytest

from serving.errors import BadInputError
from serving.hardware import (
    DEFAULT_HARDWARE,
    HARDWARE_CONFIG,
    cpu_target_for,
    engine_target,
    hardware_target,
    load_hardware,
)


def test_shipped_config_has_the_cpu_target():
    cpu = hardware_target("cpu")
    assert cpu.device == "cpu"
    assert cpu.verify_curve[0] == 1.0


def test_unknown_target_names_the_value():
    with pytest.raises(BadInputError, match="unknown hardware target 'tpu'"):
        hardware_target("tpu")


def test_bad_config_fails_at_load_with_the_key(tmp_path):
    path = tmp_path / "hardware.yaml"
    path.write_text("targets:\n  cpu:\n    verify_curve: [1.0, -2.0]\n")
    with pytest.raises(BadInputError, match="verify_curve"):
        load_hardware(path)
    path.write_text("targets:\n  cpu:\n    verify_curve: [1.0]\n    colour: red\n")
    with pytest.raises(BadInputError, match="colour"):
        load_hardware(path)


def test_config_file_is_where_the_code_looks():
    assert HARDWARE_CONFIG.name == "hardware.yaml" and HARDWARE_CONFIG.is_file()


def test_the_cuda_target_loads_from_the_shipped_config():
    cuda = hardware_target("cuda")
    assert (cuda.backend, cuda.device, cuda.kernels) == ("transformers", "cuda", "stock")
    assert cuda.dtype == "float32" and cuda.threads == 8
    # Measured on an H200 by the GPU kit (configs/hardware.yaml): one to sixteen rows.
    assert cuda.runs_here is False and cuda.verify_curve is not None
    curve = cuda.verify_curve
    assert len(curve) == 16 and curve[0] == 1.0
    assert all(a <= b for a, b in itertools.pairwise(curve))
    assert cuda.load_options() == {"kernels": "stock", "device": "cuda", "dtype": "float32"}
    assert engine_target("cpu").load_options()["device"] == "cpu"
    # Measured, so the engine takes the target (options are checked before any load).
    assert engine_target("cuda").name == "cuda"


def test_the_engine_refuses_a_target_whose_curve_was_not_measured(tmp_path):
    path = tmp_path / "hardware.yaml"
    path.write_text(
        "targets:\n  cuda:\n    device: cuda\n    kernels: stock\n    verify_curve: null\n"
        "    runs_here: false\n"
    )
    message = (
        "the cuda target's verify curve has not been measured: run `specops profile "
        f"--hardware cuda` on that GPU and put its curve in {path}"
    )
    with pytest.raises(BadInputError) as excinfo:
        engine_target("cuda", path)
    assert str(excinfo.value) == message
    # `specops profile` is what measures it, so it may resolve the target.
    assert engine_target("cuda", path, require_curve=False).device == "cuda"


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        # A transformers target that runs here still needs its curve.
        ("device: cuda\n    kernels: stock", "needs its measured verify_curve"),
        ("device: cpu\n    runs_here: true", "needs its measured verify_curve"),
        # oneDNN packs float32 layers on the CPU only.
        ("device: cuda\n    kernels: onednn\n    runs_here: false", "kernels 'onednn'"),
        ("dtype: bfloat16\n    kernels: onednn\n    runs_here: false", "kernels 'onednn'"),
        ("device: neuron\n    runs_here: false", "not on device 'neuron'"),
    ],
)
def test_engine_targets_are_checked_at_load(tmp_path, target, shown):
    path = tmp_path / "hardware.yaml"
    path.write_text(f"targets:\n  gpu:\n    {target}\n")
    with pytest.raises(BadInputError, match=shown):
        load_hardware(path)


def test_an_unmeasured_target_that_does_not_run_here_loads(tmp_path):
    path = tmp_path / "hardware.yaml"
    path.write_text(
        "targets:\n  gpu:\n    device: cuda:1\n    verify_curve: null\n    runs_here: false\n"
    )
    assert hardware_target("gpu", path).device_type == "cuda"
    with pytest.raises(BadInputError, match=f"put its curve in {path}"):
        engine_target("gpu", path)


def test_a_resolved_target_carries_its_name_and_is_frozen():
    import yaml
    from pydantic import ValidationError

    assert DEFAULT_HARDWARE == "cpu"
    cpu = engine_target(DEFAULT_HARDWARE)
    assert cpu.name == "cpu" and hardware_target("cpu-int4").name == "cpu-int4"
    # The name is the key the target is stored under, not a field of the file.
    assert "name" not in cpu.model_dump()
    assert "name" not in yaml.safe_load(yaml.safe_dump(cpu.model_dump()))
    with pytest.raises(ValidationError, match="frozen"):
        cpu.kernels = "stock"  # type: ignore[misc]
    assert load_hardware().targets["cpu"].name == ""  # as stored: unnamed until resolved


def test_the_cpu_target_of_each_kernel_family():
    for kernels, name in [
        ("onednn", "cpu"),
        ("int8", "cpu-int8"),
        ("int4", "cpu-int4"),
        ("stock", "cpu-stock"),
    ]:
        target = cpu_target_for(kernels)
        assert (target.name, target.kernels, target.device) == (name, kernels, "cpu")
        assert target.verify_curve  # an engine target: its curve measured
    with pytest.raises(
        BadInputError, match=r"no CPU target of configs/hardware\.yaml runs kernels"
    ):
        cpu_target_for("cuda")
