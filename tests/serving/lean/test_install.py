"""Where the lean step runs, where it does not, and what it says."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from serving.errors import BadInputError
from serving.hardware import engine_target
from serving.lean import build
from serving.lean.build import LeanUnavailable
from serving.lean.install import lean_mode, make_step, preflight
from serving.lean.step import LeanStep
from serving.models.kernels import apply_kernels
from serving.models.tiny import tiny_llama
from serving.target import DEFAULT_TARGET, prepare_target
from tests.serving.lean.models import tiny_target


def test_modes_come_from_the_argument_or_the_environment(monkeypatch):
    monkeypatch.setenv("SPECOPS_LEAN", "off")
    assert lean_mode() == "off" and lean_mode("on") == "on"
    monkeypatch.setenv("SPECOPS_LEAN", "fast")
    with pytest.raises(BadInputError, match="SPECOPS_LEAN='fast'"):
        lean_mode()


def test_off_keeps_transformers_forward():
    from transformers import DynamicCache

    model = tiny_llama(hidden_size=64, intermediate_size=128)
    target = prepare_target(model, engine_target("cpu-int4"), lean_mode="off")
    assert target.kernels == "int4" and target.step is None
    assert isinstance(target.new_cache(), DynamicCache)  # passes run transformers' forward
    assert make_step(model, "off") is None


def test_stock_kernels_fall_back_quietly_or_fail_when_asked(caplog):
    with caplog.at_level(logging.INFO, logger="serving.lean.install"):
        assert preflight("stock", "cpu", "auto") is False
    assert [r.levelname for r in caplog.records] == ["INFO"] and "not stock" in caplog.text
    with pytest.raises(LeanUnavailable, match=r"SPECOPS_LEAN=on but .*not stock on cpu"):
        preflight("stock", "cpu", "on")
    # On CUDA, torch's own kernels are what the graphed step runs (serving/lean/graphed.py).
    assert preflight("stock", "cuda", "auto") is True
    assert preflight("stock", "cuda", "off") is False
    model = tiny_llama()  # stock kernels: not packed for the CPU
    assert make_step(model, "auto") is None
    with pytest.raises(LeanUnavailable, match="not packed for the CPU"):
        make_step(model, "on")


def test_another_architecture_decodes_through_transformers(caplog):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=96)).eval()
    apply_kernels(model, "onednn")
    with caplog.at_level(logging.WARNING, logger="serving.lean.install"):
        assert make_step(model, "auto") is None
    assert "architecture 'gpt2' is not Llama's" in caplog.text
    with torch.inference_mode():
        assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 96)


def test_unfused_projections_are_named():
    model = tiny_llama(hidden_size=64, intermediate_size=128)
    apply_kernels(model, "onednn")  # packed, not fused
    with pytest.raises(LeanUnavailable, match="not fused"):
        make_step(model, "on")


def test_a_missing_compiler_is_one_clear_error_before_any_weights(monkeypatch):
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(LeanUnavailable, match=r"no C\+\+ compiler .*no-such-compiler-xyz"):
        build.load_ops()
    from serving import loader

    def must_not_load(*args, **kwargs):
        raise AssertionError("weights were read before the check")

    monkeypatch.setattr("serving.models.real.load_real_model", must_not_load)
    with pytest.raises(LeanUnavailable, match=r"no C\+\+ compiler"):
        loader.load_target(DEFAULT_TARGET, engine_target("cpu-int4"), lean_mode="on")


def test_a_failing_compile_is_one_clear_error_and_leaves_no_library(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setattr(build, "build_root", lambda: tmp_path)
    monkeypatch.setenv("CXX", "false")  # on PATH, exits 1 for every source
    with pytest.raises(LeanUnavailable, match=r"did not compile with .*false"):
        build.load_ops()
    assert not list(tmp_path.rglob("*.so"))


def test_the_prebuild_command_says_why_it_cannot_build(monkeypatch, capsys):
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.delenv("SPECOPS_LEAN", raising=False)
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    assert build.main() == 0
    assert "lean ops unavailable: " in capsys.readouterr().out


def test_layers_n_drafts_of_a_lean_target_run_lean_too():
    from serving.models.truncated import first_layers

    target = tiny_target("int4")
    draft = target.over(first_layers(target.model, 2))
    assert isinstance(draft.step, LeanStep) and len(draft.step.layers) == 2
    assert draft.kernels == "int4"


_REBUILD = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
from serving.lean import build
cxx = build.compiler()
folder = build.build_root() / build.build_key(cxx)
folder.mkdir(parents=True)
(folder / "specops_lean.so").write_bytes(b"not a library")
path = build.load_ops()
import torch
x = torch.ones(2, 8)
print("ok", path.stat().st_size > 1000, torch.ops.specops_lean.silu_mul(x, False).shape)
"""


@pytest.mark.slow
def test_a_corrupt_build_is_rebuilt_not_trusted(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", _REBUILD],
        env={**__import__("os").environ, "SPECOPS_CACHE": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "rebuilding the lean ops" in run.stdout + run.stderr
    assert "ok True torch.Size([2, 4])" in run.stdout
