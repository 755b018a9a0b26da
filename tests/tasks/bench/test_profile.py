from __future__ import annotations

import itertools

import pytest
import torch
import yaml

from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from serving.models.tiny import tiny_llama
from tasks.bench.profile import config_curve, curve_yaml, profile_hardware, profile_model


def test_profile_reports_a_curve_relative_to_one_token():
    result = profile_model(
        tiny_llama(), max_n=3, context=16, repeats=2, draft_layers=(1, 2), progress=False
    )
    assert result["verify_curve"][0] == 1.0
    assert len(result["verify_curve"]) == 3
    assert set(result["draft_cost"]) == {"layers:1", "layers:2"}
    assert all(t > 0 for t in result["target_pass_s"].values())


def test_profile_records_where_it_ran_and_the_curve_the_config_takes():
    result = profile_model(
        tiny_llama(), max_n=4, context=8, repeats=1, draft_layers=(), progress=False
    )
    assert (result["device"], result["device_name"], result["dtype"]) == ("cpu", "cpu", "float32")
    curve = result["config_curve"]
    assert curve[0] == 1.0 and all(b >= a for a, b in itertools.pairwise(curve))
    assert all(c >= v for c, v in zip(curve, result["verify_curve"], strict=True))


def test_the_config_curve_is_non_decreasing_and_printed_as_yaml():
    assert config_curve([1.0, 1.3, 1.2, 1.5]) == [1.0, 1.3, 1.3, 1.5]
    assert curve_yaml([1.0, 1.08, 2.0]) == "verify_curve: [1.0, 1.08, 2.0]"
    loaded = yaml.safe_load(curve_yaml([1.0, 1.08, 2.0]))
    assert HardwareTarget(verify_curve=loaded["verify_curve"]).curve == (1.0, 1.08, 2.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_profiling_the_cuda_target_is_allowed_before_its_curve_exists():
    # The target resolves although its curve is missing (profiling is what measures it);
    # what stops it here is the missing GPU, named before any model is loaded.
    with pytest.raises(BadInputError, match="device 'cuda' was asked for"):
        profile_hardware("cuda")


def test_profiling_refuses_a_target_off_the_engine():
    with pytest.raises(BadInputError, match="'vllm' backend"):
        profile_hardware("cpu-vllm")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_specops_profile_names_the_missing_gpu():
    from typer.testing import CliRunner

    from specops.cli import app

    result = CliRunner().invoke(app, ["profile", "--hardware", "cuda"])
    assert result.exit_code == 2
    assert "device 'cuda' was asked for" in result.output
    assert "has not been measured" not in result.output
