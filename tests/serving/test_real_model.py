"""Losslessness on the real model: every drafter and k reproduces greedy decoding exactly."""

from __future__ import annotations

import pytest
import torch

from serving.engine.build import build_decoder
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.model import ModelDrafter
from serving.engine.drafters.plan import PLAIN, DraftPlan
from serving.engine.policy import FixedK
from serving.target import eos_ids
from tests.serving.models.passes import block_and_singles

pytestmark = pytest.mark.real_model
NEW_TOKENS = 40


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    input_ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=2,
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def references(real_stock, real_prompts) -> list[list[int]]:
    return [hf_greedy(real_stock.model, prompt, NEW_TOKENS) for prompt in real_prompts]


def test_plain_engine_matches_hf_greedy(real_stock, real_packed, real_prompts, references):
    for target in (real_stock, real_packed):
        # A loaded target stops at its model's and its tokenizer's end-of-sequence ids.
        assert target.eos_token_ids == eos_ids(target.model, target.tokenizer)
        decoder = build_decoder(target, PLAIN)
        for prompt, reference in zip(real_prompts, references, strict=True):
            assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == reference


@pytest.mark.parametrize("spec", ["pld", "ngram", "layers:2"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_every_drafter_and_k_is_lossless(spec, k, real_packed, real_prompts, references):
    decoder = build_decoder(real_packed, DraftPlan.parse(spec, policy="fixed", k=k))
    for prompt, reference in zip(real_prompts, references, strict=True):
        result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert result.token_ids == reference
        assert sum(result.from_draft) <= result.stats.accepted_tokens


def test_cost_policy_is_lossless(real_packed, real_prompts, references):
    decoder = build_decoder(real_packed, DraftPlan.parse("layers:4", policy="cost", k=8))
    for prompt, reference in zip(real_prompts, references, strict=True):
        assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == reference


def test_real_model_drafting_for_itself_accepts_every_draft(real_packed, real_prompts):
    decoder = SpeculativeDecoder(
        real_packed, drafter=ModelDrafter(real_packed, name="self"), policy=FixedK(4)
    )
    result = decoder.generate(real_prompts[1], max_new_tokens=24)
    assert result.stats.draft_tokens > 0
    assert result.stats.acceptance_rate == 1.0


def test_grounded_prompt_lookup_accepts_drafts(real_packed, real_prompts):
    decoder = build_decoder(real_packed, DraftPlan.parse("pld", policy="fixed", k=8))
    result = decoder.generate(real_prompts[0], max_new_tokens=NEW_TOKENS)
    # The answer copies the sentence: prompt lookup must gain more than a token per pass.
    assert result.stats.mean_accepted_length > 1.5


@pytest.fixture(scope="module", params=["int8", "int4"])
def real_quantised(request):
    from serving.hardware import engine_target
    from serving.loader import load_target
    from serving.target import DEFAULT_TARGET

    return load_target(DEFAULT_TARGET, engine_target(f"cpu-{request.param}"))


def test_a_quantised_target_verifies_exactly(real_quantised, real_prompts):
    # Every position of a block pass equals the one-token passes' bit for bit.
    ids = torch.tensor([real_prompts[1]])
    for rows in (2, 5):
        block, singles = block_and_singles(real_quantised, ids, rows)
        assert torch.equal(block, singles), f"{rows} rows"


@pytest.mark.parametrize(("spec", "k"), [("pld", 2), ("pld", 8), ("layers:2", 4)])
def test_a_quantised_target_is_lossless(spec, k, real_quantised, real_prompts):
    plain = build_decoder(real_quantised, PLAIN)
    decoder = build_decoder(real_quantised, DraftPlan.parse(spec, policy="fixed", k=k))
    for prompt in real_prompts:
        reference = plain.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids
        assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == reference
