"""Speculation under a token constraint: masked verification stays lossless for the
constrained target, alone and in a batch, for cut deterministic drafts and whole sampled
ones."""

from __future__ import annotations

import pytest
import torch

from serving.curves import BatchLimits
from serving.engine.batch.batch import decode_together
from serving.engine.constrained import constrain_block
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import DraftProposal
from serving.engine.drafters.model import ModelDrafter
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.errors import BadInputError
from serving.models.tiny import tiny_llama
from serving.models.truncated import first_layers
from serving.target import LoadedTarget

VOCAB = 96
LENGTH = 14  # the toy grammar's outputs: exactly this many tokens


class Alternating:
    """A toy grammar: even positions take ids 3..47, odd positions 48..95; complete after
    LENGTH tokens."""

    vocab_size = VOCAB

    def start(self) -> _State:
        return _State(0)


class _State:
    def __init__(self, position: int) -> None:
        self.position = position

    def allowed(self) -> torch.Tensor:
        mask = torch.zeros(VOCAB, dtype=torch.bool)
        if self.position < LENGTH:
            mask[3:48] = self.position % 2 == 0
            mask[48:] = self.position % 2 == 1
        return mask

    def advance(self, token: int) -> _State:
        if not bool(self.allowed()[token]):
            raise BadInputError(f"token {token} is not allowed at {self.position}")
        return _State(self.position + 1)

    def is_finished(self) -> bool:
        return self.position >= LENGTH


def constrained_greedy(tiny: LoadedTarget, prompt: list[int]) -> list[int]:
    """The constrained target's greedy output, from full forwards (no cache, no drafts)."""
    tokens, state, out = list(prompt), Alternating().start(), []
    with torch.inference_mode():
        while not state.is_finished():
            logits = tiny(torch.tensor([tokens])).logits[0, -1]
            token = int(logits.masked_fill(~state.allowed(), float("-inf")).argmax())
            state = state.advance(token)
            tokens.append(token)
            out.append(token)
    return out


PROMPTS = [[1, 5, 17, 42, 8, 5, 17, 42, 33, 9, 5, 17], [7, 60, 7, 60, 7], [4]]
DRAFTERS = {
    "none": lambda t: (None, None),
    "prompt_lookup": lambda t: (PromptLookupDrafter(), FixedK(4)),
    "first_layers": lambda t: (ModelDrafter(t.over(first_layers(t.model, 2))), FixedK(3)),
    "other_model": lambda t: (ModelDrafter(LoadedTarget.of(tiny_llama(seed=1))), FixedK(5)),
}


@pytest.fixture(scope="module")
def tiny() -> LoadedTarget:
    """A tiny target of this module's own, taken as it is."""
    return LoadedTarget.of(tiny_llama())


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_constrained_speculation_equals_the_constrained_target(tiny, drafter):
    for prompt in PROMPTS:
        made, policy = DRAFTERS[drafter](tiny)
        decoder = SpeculativeDecoder(tiny, drafter=made, policy=policy)
        result = decoder.stream(prompt, max_new_tokens=64, constraint=Alternating()).run()
        assert result.token_ids == constrained_greedy(tiny, prompt)
        assert result.stop_reason == "eos"  # the grammar completed


def test_constrained_requests_in_a_batch_equal_each_alone(tiny):
    decodings = [
        SpeculativeDecoder(tiny, drafter=made, policy=policy).begin(
            prompt, max_new_tokens=64, constraint=Alternating()
        )
        for prompt in PROMPTS
        for made, policy in [DRAFTERS[name](tiny) for name in DRAFTERS]
    ]
    results = decode_together(decodings, tiny, limits=BatchLimits(4, 32))
    expected = [constrained_greedy(tiny, p) for p in PROMPTS for _ in DRAFTERS]
    assert [r.token_ids for r in results] == expected


def test_deterministic_drafts_are_cut_at_the_first_forbidden_one():
    proposal = DraftProposal(torch.tensor([10, 50, 11, 12]))  # 12 breaks the alternation
    cut, states, masks = constrain_block(proposal, Alternating().start(), cut=True)
    assert cut.tokens.tolist() == [10, 50, 11]
    assert [s.position for s in states] == [0, 1, 2, 3] and masks.shape == (4, VOCAB)
    whole, states, masks = constrain_block(proposal, Alternating().start(), cut=False)
    assert len(whole) == 4 and len(states) == 4 and masks.shape == (5, VOCAB)


def test_a_constraint_of_another_vocabulary_is_refused(tiny):
    class Wide(Alternating):
        vocab_size = VOCAB + 1

    with pytest.raises(BadInputError, match="vocabulary has 96"):
        SpeculativeDecoder(tiny).begin([1, 2], constraint=Wide())
