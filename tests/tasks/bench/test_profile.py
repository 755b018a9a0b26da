from __future__ import annotations

import itertools

import pytest
import torch
import yaml

from serving.errors import BadInputError
from serving.hardware import HardwareTarget, engine_target
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget
from tasks.bench.profile import (
    batch_yaml,
    config_curve,
    curve_yaml,
    plot_batch,
    profile_batch,
    profile_hardware,
    profile_model,
    split_rows,
)


def test_profile_reports_a_curve_relative_to_one_token():
    result = profile_model(
        LoadedTarget.of(tiny_llama()),
        max_n=3,
        context=16,
        repeats=2,
        draft_layers=(1, 2),
        progress=False,
    )
    assert result["verify_curve"][0] == 1.0
    assert len(result["verify_curve"]) == 3
    # The first layers' passes, and every lookup kind's cost per drafted token (the
    # profile's context repeated, so there is something to look up).
    assert set(result["draft_cost"]) == {"layers:1", "layers:2", "pld", "ngram", "suffix"}
    assert all(cost >= 0 for cost in result["draft_cost"].values())
    assert all(t > 0 for t in result["target_pass_s"].values())


def test_profile_times_a_head_draft_like_the_other_kinds(tmp_path):
    from serving.models.head import DraftHead, head_config_for, save_head

    model = tiny_llama()
    torch.manual_seed(0)
    head = save_head(DraftHead(head_config_for(model, intermediate_size=48)), tmp_path / "head")
    result = profile_model(
        LoadedTarget.of(model),
        max_n=3,
        context=16,
        repeats=2,
        draft_layers=(),
        drafts=[f"head:{head}"],
        progress=False,
    )
    assert set(result["draft_cost"]) == {"pld", "ngram", "suffix", f"head:{head}"}
    assert result["draft_cost"][f"head:{head}"] > 0  # a head runs a block: never free


def test_profiling_refuses_a_bad_draft_before_loading_the_target(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr("tasks.bench.profile.load_for", refuse)
    with pytest.raises(BadInputError, match="unknown drafter 'warp'"):
        profile_hardware(engine_target("cpu"), drafts=["warp"])


def test_profile_records_where_it_ran_and_the_curve_the_config_takes():
    result = profile_model(
        LoadedTarget.of(tiny_llama()),
        max_n=4,
        context=8,
        repeats=1,
        draft_layers=(),
        progress=False,
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
        profile_hardware(engine_target("cuda", require_curve=False))


def test_profiling_refuses_a_target_off_the_engine():
    with pytest.raises(BadInputError, match="'vllm' backend"):
        profile_hardware(engine_target("cpu-vllm", require_curve=False))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_specops_profile_names_the_missing_gpu():
    from typer.testing import CliRunner

    from specops.cli import app

    result = CliRunner().invoke(app, ["profile", "--hardware", "cuda"])
    assert result.exit_code == 2
    assert "device 'cuda' was asked for" in result.output
    assert "has not been measured" not in result.output


def test_batch_profile_is_relative_to_one_row_of_one_sequence():
    result = profile_batch(
        LoadedTarget.of(tiny_llama()),
        rows=(1, 2, 4, 6),
        sequences=(1, 2, 4),
        context=12,
        repeats=1,
        progress=False,
    )
    cells = {(cell["rows"], cell["sequences"]) for cell in result["table"]}
    assert cells == {(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (6, 1), (6, 2), (6, 4)}
    assert all(cell["sequences"] <= cell["rows"] for cell in result["table"])
    assert all(cell["pass_s"] > 0 for cell in result["table"])
    one_row = next(cell for cell in result["table"] if cell["rows"] == 1)
    assert one_row["cost"] == 1.0
    assert len(result["context"]) == 4 and all(9 <= c <= 15 for c in result["context"])
    assert (result["device"], result["dtype"]) == ("cpu", "float32")
    # Prefills of growing prompts from an empty cache, within the model's context.
    sizes = [n for n, _ in result["prefill"]]
    assert sizes and sizes == sorted(sizes) and sizes[0] == 16
    assert all(seconds > 0 for _, seconds in result["prefill"])


def test_the_batch_curve_takes_the_most_sequences_and_pastes_into_the_config():
    result = profile_batch(
        LoadedTarget.of(tiny_llama()),
        rows=(1, 2, 3, 8),
        sequences=(1, 2, 8),
        context=8,
        repeats=1,
        progress=False,
    )
    curve = result["batch_curve"]
    assert [n for n, _ in curve] == [1, 2, 3, 8] and curve[0] == (1, 1.0)
    assert all(b >= a for (_, a), (_, b) in itertools.pairwise(curve))
    widest = {n: max(c["sequences"] for c in result["table"] if c["rows"] == n) for n, _ in curve}
    assert widest == {1: 1, 2: 2, 3: 2, 8: 8}
    loaded = yaml.safe_load(batch_yaml(curve))
    target = HardwareTarget(verify_curve=[1.0], batch_curve=loaded["batch_curve"])
    assert target.batch_curve == [tuple(point) for point in curve]


def test_batch_profile_plots_and_leaves_the_model_usable(tmp_path):
    model = tiny_llama()
    result = profile_batch(
        LoadedTarget.of(model), rows=(1, 4), sequences=(1, 4), context=8, repeats=2, progress=False
    )
    path = plot_batch(result, tmp_path / "profile-batch.png")
    assert path.read_bytes().startswith(b"\x89PNG")
    # The model now takes packed passes; a plain pass still runs.
    assert model.config._attn_implementation == "specops_ragged"
    model(input_ids=torch.tensor([[3, 4]]))


def test_rows_are_split_as_evenly_as_possible():
    assert split_rows(7, 3) == [3, 2, 2]
    assert split_rows(8, 8) == [1] * 8
    with pytest.raises(ValueError, match="cannot share"):
        split_rows(2, 4)
