import pytest
import torch

from serving.engine.drafters.base import DraftRequest, StepFeedback
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.sampling import make_sampler
from serving.errors import BadInputError

GREEDY = make_sampler()


def propose(tokens: list[int], k: int, **kwargs) -> list[int]:
    drafter = PromptLookupDrafter(**kwargs)
    drafter.begin(tokens)
    proposal = drafter.propose(DraftRequest(tokens, k, GREEDY))
    assert proposal.tokens.dtype == torch.int64
    assert proposal.draft_probs is None  # deterministic: the verifier treats it as one-hot
    return proposal.tokens.tolist()


def test_copies_what_followed_the_earlier_occurrence():
    assert propose([1, 2, 3, 4, 1, 2], k=3) == [3, 4, 1]


def test_longest_match_wins_over_a_more_recent_shorter_one():
    # (5, 1, 2) was followed by 9; the more recent (1, 2) by 8.
    assert propose([5, 1, 2, 9, 3, 1, 2, 8, 5, 1, 2], k=1) == [9]
    assert propose([5, 1, 2, 9, 3, 1, 2, 8, 5, 1, 2], k=1, max_ngram=2) == [8]


def test_most_recent_occurrence_wins():
    assert propose([1, 2, 3, 1, 2, 4, 1, 2], k=1) == [4]
    assert propose([7, 3, 7, 4, 7], k=2) == [4, 7]


def test_chains_past_the_end_of_the_copied_span():
    # The span after the match runs out at the end of the sequence; the drafter then looks
    # up the suffix that includes its own drafts and keeps copying.
    assert propose([1, 2, 3, 4, 1, 2], k=5) == [3, 4, 1, 2, 3]
    assert propose([1, 2, 3] * 4, k=7) == [1, 2, 3, 1, 2, 3, 1]


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_never_proposes_more_than_k(k):
    assert propose([1, 2, 3] * 4, k=k) == ([1, 2, 3] * 3)[:k]


def test_empty_proposal_when_nothing_matches():
    assert propose([1, 2, 3, 4], k=4) == []
    assert propose([9], k=4) == []


def test_min_ngram_ignores_shorter_matches():
    assert propose([1, 5, 2, 5], k=1) == [2]
    assert propose([1, 5, 2, 5], k=1, min_ngram=2) == []


def test_commit_extends_the_index_and_begin_resets_it():
    drafter = PromptLookupDrafter()
    drafter.begin([1, 2, 3])
    assert drafter.propose(DraftRequest([1, 2, 3], 3, GREEDY)).tokens.tolist() == []
    drafter.commit(StepFeedback(proposed=0, accepted=0, new_tokens=[1, 2], tokens=[1, 2, 3, 1, 2]))
    assert drafter.propose(DraftRequest([1, 2, 3, 1, 2], 3, GREEDY)).tokens.tolist() == [3, 1, 2]
    drafter.begin([4, 5])  # a new request forgets the previous one
    assert drafter.propose(DraftRequest([4, 5], 3, GREEDY)).tokens.tolist() == []


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"min_ngram": 0}, "min_ngram=0"),
        ({"min_ngram": 3, "max_ngram": 2}, "min_ngram=3, max_ngram=2"),
        ({"max_ngram": 0}, "max_ngram=0"),
    ],
)
def test_bad_arguments_raise(kwargs, shown):
    with pytest.raises(BadInputError, match=shown):
        PromptLookupDrafter(**kwargs)
