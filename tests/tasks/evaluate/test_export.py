"""Exporting draft packages to each backend's format."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from serving.backends import UnsupportedDraftError
from serving.engine.drafters.package import DraftManifest, write_package
from serving.errors import ModelSourceError
from serving.models.truncated import first_layers
from tasks.evaluate.export import export_draft, load_export, speculation_for
from tasks.train.distill_model import base_draft, merge_lora


def package(tmp_path, drafter):
    return write_package(tmp_path / drafter.replace(":", "-"), DraftManifest(drafter=drafter))


def test_prompt_lookup_becomes_vllms_ngram_method(tmp_path):
    out = export_draft(package(tmp_path, "pld:4"), "vllm", tmp_path / "out", k=3)
    speculation = load_export(out, "vllm")
    assert (speculation.method, speculation.num_speculative_tokens) == ("ngram", 3)
    assert speculation.prompt_lookup_max == 4
    assert not (out / "draft").exists()


@pytest.mark.parametrize(
    ("drafter", "backend"),
    [("ngram:4", "vllm"), ("suffix", "mlx"), ("pld:3", "mlx"), ("ngram:3", "neuron")],
)
def test_drafts_a_backend_cannot_load_fail_before_model_work(tmp_path, drafter, backend):
    with pytest.raises(UnsupportedDraftError, match=backend):
        export_draft(package(tmp_path, drafter), backend, tmp_path / "out", k=3)
    assert not (tmp_path / "out").exists()


def test_suffix_becomes_vllms_suffix_method_and_says_its_corpus_stays(tmp_path):
    out = export_draft(package(tmp_path, "suffix"), "vllm", tmp_path / "out", k=3)
    speculation = load_export(out, "vllm")
    assert (speculation.method, speculation.num_speculative_tokens) == ("suffix", 3)
    # specops's defaults: no cap per matched token, no confidence floor
    assert (speculation.suffix_max_spec_factor, speculation.suffix_min_token_prob) == (3.0, 0.0)
    assert "corpus" in json.loads((out / "export.json").read_text())["notes"][0]


@pytest.mark.real_model
def test_a_layers_draft_is_written_as_a_model_of_its_own(tmp_path, model_folder):
    out = export_draft(
        package(tmp_path, "layers:1"), "mlx", tmp_path / "out", k=2, target=str(model_folder)
    )
    speculation = load_export(out, "mlx")
    assert speculation.method == "draft_model"
    exported = AutoModelForCausalLM.from_pretrained(speculation.draft_path)
    assert exported.config.num_hidden_layers == 1
    target = AutoModelForCausalLM.from_pretrained(model_folder)
    ids = torch.tensor([[1, 5, 17, 42, 8]])
    with torch.inference_mode():
        expected = first_layers(target, 1)(ids).logits
        assert torch.allclose(exported(ids).logits, expected, atol=1e-5)
    assert (out / "draft" / "tokenizer.json").is_file()  # mlx-lm loads one with every model
    with pytest.raises(UnsupportedDraftError, match="not 'vllm'"):
        load_export(out, "vllm")


@pytest.mark.parametrize("backend", ["vllm", "mlx", "neuron"])
def test_a_stored_lora_adapter_is_a_model_draft_on_every_backend(backend):
    speculation = speculation_for("lora:adapter", backend, 3)
    assert (speculation.method, speculation.draft_path) == ("draft_model", "draft")


@pytest.mark.real_model
def test_a_stored_lora_adapter_is_merged_and_written_as_a_model_of_its_own(
    tmp_path, model_folder, lora_adapter
):
    target = AutoModelForCausalLM.from_pretrained(model_folder).eval()
    manifest = DraftManifest(drafter="lora:adapter", family="lora")
    adapter = lora_adapter(target, tmp_path / "adapter", layers=1)
    folder = write_package(tmp_path / "lora", manifest, {"adapter": adapter})
    out = export_draft(folder, "vllm", tmp_path / "out", k=2, target=str(model_folder))
    speculation = load_export(out, "vllm")
    assert speculation.method == "draft_model"
    exported = AutoModelForCausalLM.from_pretrained(out / speculation.draft_path).eval()
    assert exported.config.num_hidden_layers == 1
    merged = merge_lora(adapter, base_draft(target, layers=1, draft_model=None)).eval()
    ids = torch.tensor([[1, 5, 17, 42, 8]])
    with torch.inference_mode():
        assert torch.equal(exported(ids).logits, merged(ids).logits)
    assert (out / "draft" / "tokenizer.json").is_file()
    assert not any(path.name.startswith("adapter") for path in (out / "draft").iterdir())


def test_a_broken_export_is_a_clear_error(tmp_path):
    with pytest.raises(ModelSourceError, match=r"export\.json is missing"):
        load_export(tmp_path, "vllm")
    (tmp_path / "export.json").write_text(
        json.dumps(
            {
                "backend": "vllm",
                "speculation": {
                    "method": "draft_model",
                    "num_speculative_tokens": 2,
                    "draft_path": "draft",
                },
            }
        )
    )
    with pytest.raises(ModelSourceError, match="lacks its draft model folder"):
        load_export(tmp_path, "vllm")
