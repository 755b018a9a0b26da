"""Skeleton-of-thought on the real model: the skeleton always parses, each branch decoded
in the batch equals its decoding alone, and budgets are reported."""

from __future__ import annotations

import pytest

from serving.engine.build import build_decoder
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.plan import DraftPlan
from serving.loader import encode_messages
from serving.skeleton.constraint import SkeletonConstraint
from serving.skeleton.decode import answer_with_skeleton
from serving.skeleton.parse import parse_skeleton
from serving.skeleton.prompts import branch_messages

pytestmark = pytest.mark.real_model

QUESTIONS = ["How do I plan a birthday party?", "What are some tips for learning to cook?"]


@pytest.fixture(scope="module")
def setup(real_packed):
    target, tokenizer = real_packed, real_packed.tokenizer
    constraint = SkeletonConstraint(
        tokenizer, vocab_size=target.vocab_size, eos_token_ids=list(target.eos_token_ids)
    )
    plan = DraftPlan.parse("pld", policy="fixed", k=4)

    def new_decoder() -> SpeculativeDecoder:
        return build_decoder(target, plan)  # stops at the target's end-of-sequence ids

    return target, tokenizer, constraint, new_decoder


@pytest.mark.parametrize("question", QUESTIONS)
def test_branches_equal_their_solo_decoding(setup, question):
    target, tokenizer, constraint, new_decoder = setup
    answer = answer_with_skeleton(new_decoder, tokenizer, question, constraint, max_tokens=24)
    skeleton = parse_skeleton(answer.skeleton_text)
    assert skeleton == answer.skeleton
    if skeleton.direct:
        assert answer.direct_tokens > 0 and not answer.branches
        return
    assert len(answer.branches) == len(skeleton.points) >= 2
    for i, (branch, result) in enumerate(zip(answer.branches, answer.results[1:], strict=True)):
        ids = encode_messages(tokenizer, branch_messages(question, skeleton, i))
        alone = build_decoder(target).generate(ids, max_new_tokens=24)
        assert result.token_ids == alone.token_ids, f"branch {i + 1}"
        assert branch.truncated == (alone.stop_reason == "length")
    assert answer.truncated == any(b.truncated for b in answer.branches)
    for i, point in enumerate(skeleton.points, start=1):
        assert f"{i}. {point}:" in answer.text
