"""A registered draft exported, evaluated and promoted on another hardware target."""

from __future__ import annotations

import pytest

from serving.engine.drafters.package import DraftManifest, write_package
from serving.hardware import hardware_target
from tasks.loop.target_promotion import evaluate_registered, export_for_targets
from tests.tasks.evaluate.test_targets import PROMPTS
from tests.tasks.loop.priced_gates import use_priced_gates


def test_export_on_promotion_covers_every_backend_that_can_load_it(registry, tmp_path):
    pld = registry.log_draft(
        write_package(tmp_path / "pld", DraftManifest(drafter="pld:3")), family="ngram"
    )
    outcomes = export_for_targets(registry, pld, tmp_path / "cache")
    assert outcomes["vllm"].startswith("exported")
    assert "cannot draft with 'ngram'" in outcomes["mlx"]
    assert "export.vllm" in registry.get("ngram", pld.version).tags


@pytest.mark.real_model
def test_a_draft_no_backend_can_load_is_reported_not_raised(registry, tmp_path):
    from serving.models.tiny import tiny_llama

    tiny = tiny_llama()  # 96 tokens: no draft for the shipped 49152-token target
    tiny.save_pretrained(tmp_path / "weights")
    package = write_package(
        tmp_path / "tiny", DraftManifest(drafter="model:weights", family="lora"),
        {"weights": tmp_path / "weights"},
    )  # fmt: skip
    draft = registry.log_draft(package, family="lora")
    outcomes = export_for_targets(registry, draft, tmp_path / "cache")
    assert outcomes and all(o.startswith("not exported") for o in outcomes.values()), outcomes
    assert "96 tokens" in " ".join(outcomes.values())
    assert not any(k.startswith("export.") for k in registry.get("lora", draft.version).tags)


@pytest.mark.real_model
def test_evaluated_there_then_promoted_there(registry, tmp_path, monkeypatch):
    use_priced_gates(monkeypatch, tmp_path)  # prompt lookup must pass: see priced_gates.py
    pld = registry.log_draft(
        write_package(tmp_path / "pld", DraftManifest(drafter="pld:3")), family="ngram"
    )
    report = evaluate_registered(
        registry,
        hardware_target("cpu-stock"),
        [pld],
        PROMPTS,
        cache=tmp_path / "cache",
        workdir=tmp_path / "w",
        max_new_tokens=16,
    )
    result = report["results"][pld.label]
    assert result["exact"]
    assert registry.get("ngram", pld.version).evaluated_on("cpu-stock")
    assert registry.champion("cpu") is None  # other targets untouched
    assert report["decision"]["promoted"] == pld.label
    assert "bar 1.00x" in report["decision"]["reason"]
    assert registry.champion("cpu-stock").label == pld.label
