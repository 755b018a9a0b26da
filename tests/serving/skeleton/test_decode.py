"""Skeleton-of-thought on the real model: the skeleton always parses, each branch decoded
in the batch equals its decoding alone, and budgets are reported."""

from __future__ import annotations

import pytest

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.loader import encode_messages, eos_ids
from serving.skeleton.constraint import SkeletonConstraint
from serving.skeleton.decode import answer_with_skeleton
from serving.skeleton.parse import parse_skeleton
from serving.skeleton.prompts import branch_messages

pytestmark = pytest.mark.real_model

QUESTIONS = ["How do I plan a birthday party?", "What are some tips for learning to cook?"]


@pytest.fixture(scope="module")
def setup(real_packed):
    model, tokenizer = real_packed
    eos = eos_ids(model, tokenizer)
    constraint = SkeletonConstraint(
        tokenizer, vocab_size=int(model.config.vocab_size), eos_token_ids=eos
    )

    def new_decoder() -> SpeculativeDecoder:
        return SpeculativeDecoder(
            model, drafter=PromptLookupDrafter(), policy=FixedK(4), eos_token_ids=eos
        )

    return model, tokenizer, constraint, new_decoder


@pytest.mark.parametrize("question", QUESTIONS)
def test_branches_equal_their_solo_decoding(setup, question):
    model, tokenizer, constraint, new_decoder = setup
    answer = answer_with_skeleton(new_decoder, tokenizer, question, constraint, max_tokens=24)
    skeleton = parse_skeleton(answer.skeleton_text)
    assert skeleton == answer.skeleton
    if skeleton.direct:
        assert answer.direct_tokens > 0 and not answer.branches
        return
    assert len(answer.branches) == len(skeleton.points) >= 2
    for i, (branch, result) in enumerate(zip(answer.branches, answer.results[1:], strict=True)):
        ids = encode_messages(tokenizer, branch_messages(question, skeleton, i))
        alone = SpeculativeDecoder(model, eos_token_ids=eos_ids(model, tokenizer)).generate(
            ids, max_new_tokens=24
        )
        assert result.token_ids == alone.token_ids, f"branch {i + 1}"
        assert branch.truncated == (alone.stop_reason == "length")
    assert answer.truncated == any(b.truncated for b in answer.branches)
    for i, point in enumerate(skeleton.points, start=1):
        assert f"{i}. {point}:" in answer.text
