import re

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import DraftRequest, StepFeedback
from serving.engine.drafters.model import ModelDrafter
from serving.engine.kv import cache_length
from serving.engine.policy import FixedK
from serving.engine.sampling import SamplingParams, make_sampler
from serving.engine.step import speculative_step
from serving.errors import BadInputError, IncompatibleDraftError
from serving.models.tiny import tiny_llama
from serving.models.truncated import first_layers
from serving.target import LoadedTarget

GREEDY = make_sampler()


@pytest.fixture(scope="module")
def draft_model():
    return tiny_llama(seed=1)


def greedy_continuation(model, tokens: list[int], k: int) -> list[int]:
    with torch.inference_mode():
        input_ids = torch.tensor([tokens])
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),  # token 0 is the pad id: never mask it
            max_new_tokens=k,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(tokens) :].tolist()


@pytest.mark.parametrize("accepted", [0, 1, 2, 3, 4])
def test_commit_rewinds_the_cache_to_the_accepted_prefix(draft_model, prompt, accepted):
    drafter = ModelDrafter(LoadedTarget.of(draft_model))
    drafter.begin(prompt)
    drafts = drafter.propose(DraftRequest(prompt, 4, GREEDY)).tokens.tolist()
    assert drafts == greedy_continuation(draft_model, prompt, 4)
    # The last draft was sampled, not fed: the cache holds the prompt and drafts 1..3.
    assert cache_length(drafter._cache) == len(prompt) + 3

    correction = (drafts[accepted] + 1) % 96 if accepted < 4 else 0
    new_tokens = [*drafts[:accepted], correction]
    tokens = prompt + new_tokens
    drafter.commit(StepFeedback(4, accepted, new_tokens, tokens))
    assert cache_length(drafter._cache) == len(prompt) + min(accepted, 3)

    # What survived the rewind is right: the next proposal is the draft's own greedy
    # continuation of the committed tokens.
    next_drafts = drafter.propose(DraftRequest(tokens, 3, GREEDY)).tokens.tolist()
    assert next_drafts == greedy_continuation(draft_model, tokens, 3)


def test_cache_tracks_the_committed_tokens_across_steps(loaded, prompt):
    draft = first_layers(loaded.model, 3)  # agrees with the target only sometimes
    drafter = ModelDrafter(loaded.over(draft))
    proposals: list[tuple[list[int], list[int]]] = []
    propose = drafter.propose

    def recording_propose(request):
        proposal = propose(request)
        proposals.append((list(request.tokens), proposal.tokens.tolist()))
        return proposal

    drafter.propose = recording_propose
    cache = loaded.new_cache()
    with torch.inference_mode():
        loaded(input_ids=torch.tensor([prompt[:-1]]), past_key_values=cache, use_cache=True)
    drafter.begin(list(prompt))
    tokens = list(prompt)
    accepted_counts = []
    for _ in range(20):
        base = len(tokens)
        step = speculative_step(loaded, cache, tokens, drafter, 4, GREEDY)
        tokens += step.new_tokens
        accepted_counts.append(step.accepted)
        assert cache_length(cache) == len(tokens) - 1
        assert cache_length(drafter._cache) == base + min(step.accepted, step.proposed - 1)
    assert 0 in accepted_counts and max(accepted_counts) > 0  # rewinds of every kind happened
    for seen, drafts in proposals:
        assert drafts == greedy_continuation(draft, seen, 4)


def test_early_stop_below_the_confidence_threshold(draft_model, prompt):
    drafter = ModelDrafter(LoadedTarget.of(draft_model), confidence_threshold=0.999)
    drafter.begin(prompt)
    proposal = drafter.propose(DraftRequest(prompt, 4, GREEDY))
    assert len(proposal) == 1  # a random tiny model is never that sure
    assert float(proposal.draft_probs[0].max()) < 0.999
    assert cache_length(drafter._cache) == len(prompt)


def test_sampling_drafts_carry_the_distribution_they_were_drawn_from(draft_model, prompt):
    sampler = make_sampler(SamplingParams(temperature=0.8, top_k=5, seed=0))
    drafter = ModelDrafter(LoadedTarget.of(draft_model))
    drafter.begin(prompt)
    proposal = drafter.propose(DraftRequest(prompt, 3, sampler))
    assert proposal.draft_probs is not None and proposal.draft_probs.shape == (3, 96)
    torch.testing.assert_close(proposal.draft_probs.sum(-1), torch.ones(3))
    assert ((proposal.draft_probs > 0).sum(-1) == 5).all()  # top-k applied to the draft
    with torch.inference_mode():
        logits = draft_model(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(proposal.draft_probs[0], sampler.probs(logits))
    picked = proposal.draft_probs[torch.arange(3), proposal.tokens]
    assert (picked > 0).all()


def test_incompatible_vocabulary_is_refused(loaded):
    drafter = ModelDrafter(LoadedTarget.of(tiny_llama(vocab_size=64)), name="small-vocab")
    with pytest.raises(IncompatibleDraftError, match=r"64 tokens.*has 96"):
        drafter.check_compatible(96)
    with pytest.raises(IncompatibleDraftError, match="small-vocab"):
        SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(2))


@pytest.mark.parametrize("threshold", [-0.1, 1.0, 2.0])
def test_bad_confidence_threshold_raises(draft_model, threshold):
    with pytest.raises(BadInputError, match=re.escape(repr(threshold))):
        ModelDrafter(LoadedTarget.of(draft_model), confidence_threshold=threshold)
