"""Losslessness on the real model: every drafter and k reproduces greedy decoding exactly."""

from __future__ import annotations

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.model import ModelDrafter
from serving.engine.policy import CostAwareK, FixedK
from serving.loader import eos_ids
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
    model, _ = real_stock
    return [hf_greedy(model, prompt, NEW_TOKENS) for prompt in real_prompts]


def test_plain_engine_matches_hf_greedy(real_stock, real_packed, real_prompts, references):
    for model, tokenizer in (real_stock, real_packed):
        decoder = SpeculativeDecoder(model, eos_token_ids=eos_ids(model, tokenizer))
        for prompt, reference in zip(real_prompts, references, strict=True):
            assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == reference


@pytest.mark.parametrize("spec", ["pld", "ngram", "layers:2"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_every_drafter_and_k_is_lossless(spec, k, real_packed, real_prompts, references):
    model, tokenizer = real_packed
    drafter = build_drafter(spec, model, tokenizer)
    decoder = SpeculativeDecoder(
        model, drafter=drafter, policy=FixedK(k), eos_token_ids=eos_ids(model, tokenizer)
    )
    for prompt, reference in zip(real_prompts, references, strict=True):
        result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert result.token_ids == reference
        assert sum(result.from_draft) <= result.stats.accepted_tokens


def test_cost_policy_is_lossless(real_packed, real_prompts, references):
    model, tokenizer = real_packed
    decoder = SpeculativeDecoder(
        model,
        drafter=build_drafter("layers:4", model, tokenizer),
        policy=CostAwareK(k_max=8),
        eos_token_ids=eos_ids(model, tokenizer),
    )
    for prompt, reference in zip(real_prompts, references, strict=True):
        assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == reference


def test_real_model_drafting_for_itself_accepts_every_draft(real_packed, real_prompts):
    model, tokenizer = real_packed
    decoder = SpeculativeDecoder(
        model,
        drafter=ModelDrafter(model, name="self"),
        policy=FixedK(4),
        eos_token_ids=eos_ids(model, tokenizer),
    )
    result = decoder.generate(real_prompts[1], max_new_tokens=24)
    assert result.stats.draft_tokens > 0
    assert result.stats.acceptance_rate == 1.0


def test_grounded_prompt_lookup_accepts_drafts(real_packed, real_prompts):
    model, tokenizer = real_packed
    decoder = SpeculativeDecoder(
        model,
        drafter=build_drafter("pld", model, tokenizer),
        policy=FixedK(8),
        eos_token_ids=eos_ids(model, tokenizer),
    )
    result = decoder.generate(real_prompts[0], max_new_tokens=NEW_TOKENS)
    # The answer copies the sentence: prompt lookup must gain more than a token per pass.
    assert result.stats.mean_accepted_length > 1.5


@pytest.fixture(scope="module", params=["int8", "int4"])
def real_quantised(request):
    from serving.loader import load_target

    return load_target(kernels=request.param)


def test_a_quantised_target_verifies_exactly(real_quantised, real_prompts):
    # Every position of a block pass equals the one-token passes' bit for bit.
    model, _ = real_quantised
    ids = torch.tensor([real_prompts[1]])
    for rows in (2, 5):
        block, singles = block_and_singles(model, ids, rows)
        assert torch.equal(block, singles), f"{rows} rows"


@pytest.mark.parametrize(("spec", "k"), [("pld", 2), ("pld", 8), ("layers:2", 4)])
def test_a_quantised_target_is_lossless(spec, k, real_quantised, real_prompts):
    model, tokenizer = real_quantised
    eos = eos_ids(model, tokenizer)
    plain = SpeculativeDecoder(model, eos_token_ids=eos)
    decoder = SpeculativeDecoder(
        model,
        drafter=build_drafter(spec, model, tokenizer),
        policy=FixedK(k),
        eos_token_ids=eos,
    )
    for prompt in real_prompts:
        reference = plain.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids
        assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == reference
