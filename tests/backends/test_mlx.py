"""mlx-lm (mlx[cpu]) reproduces its own greedy output with a draft model, tiny and real
model; exported drafts load; acceptance is counted. Runs in ``.venv-mlx`` (no torch)."""

from __future__ import annotations

import pytest

from tests.backends.conftest import ROOT, check_exact, request_for, require, run_request


@pytest.fixture(scope="module")
def fixtures():
    return require("mlx", "mlx_lm")


@pytest.mark.parametrize(
    ("model", "draft", "max_new_tokens"),
    [("tiny", "layers1", 16), ("tiny", "self", 16), ("real", "layers4", 8), ("real", "self", 8)],
)
def test_draft_model_reproduces_greedy(fixtures, tmp_path, model, draft, max_new_tokens):
    # MLX's CPU backend prefills the real model at ~50 ms a token (a 250-token prompt took
    # ~13 s a generation, and the run makes four): its first 48 tokens keep the test short.
    request = request_for(
        fixtures,
        "mlx",
        model,
        {draft: draft},
        prompts=1,
        max_new_tokens=max_new_tokens,
        prompt_tokens=48 if model == "real" else None,
    )
    result = check_exact(run_request(request, tmp_path), draft)
    assert result["checks"] > 0
    if draft == "self":
        assert result["acceptance_rate"] > 0.9
        assert result["mean_accepted_length"] > 2.5


def test_prompt_lookup_is_refused_before_loading(fixtures):
    from serving.backends import Speculation, UnsupportedDraftError, open_backend

    with pytest.raises(UnsupportedDraftError, match="mlx"):
        open_backend("mlx", str(ROOT / "no-such-model"), Speculation("ngram", 3))


def test_a_missing_extra_names_it(fixtures):
    """vLLM is not in the MLX environment: asking for it says how to install it."""
    from serving.backends import BackendUnavailableError, Speculation, open_backend

    with pytest.raises(BackendUnavailableError, match=r"setup_backend.sh vllm"):
        open_backend("vllm", str(ROOT / "no-such-model"), Speculation())
