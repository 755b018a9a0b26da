import pytest
import torch

from serving.engine.drafters.base import DraftRequest, StepFeedback
from serving.engine.drafters.ngram_store import NGramDrafter, NGramStore, Prediction
from serving.engine.sampling import make_sampler
from serving.errors import BadInputError

GREEDY = make_sampler()


def store_of(tokens: list[int], n: int = 3) -> NGramStore:
    store = NGramStore(n)
    store.add(tokens)
    return store


def test_store_counts_every_context_up_to_n_minus_one():
    store = store_of([1, 2, 3, 1, 2, 4], n=3)
    # contexts: (1,) (2,) (3,) (1, 2) (2, 3) (3, 1)
    assert len(store) == 6
    assert store.predict([9, 1]) == Prediction(token=2, confidence=1.0, order=2)
    assert store.predict([3]) == Prediction(token=1, confidence=1.0, order=2)
    assert store.predict([2, 3]) == Prediction(token=1, confidence=1.0, order=3)


def test_longest_known_context_wins():
    store = store_of([5, 1, 7, 9, 1, 8, 9, 1, 8], n=3)
    assert store.predict([1]) == Prediction(token=8, confidence=2 / 3, order=2)
    assert store.predict([5, 1]) == Prediction(token=7, confidence=1.0, order=3)


def test_most_frequent_token_wins_with_its_relative_frequency():
    store = store_of([5, 1, 5, 2, 5, 1], n=2)
    assert store.predict([5]) == Prediction(token=1, confidence=2 / 3, order=2)


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ([5, 1, 5, 2], 2),
        ([5, 2, 5, 1], 1),
        ([5, 1, 5, 1, 5, 2, 5, 2], 2),
        ([5, 2, 5, 2, 5, 1, 5, 1], 1),
        ([5, 1, 5, 2, 5, 2, 5, 1], 1),
    ],
)
def test_ties_go_to_the_most_recent(tokens, expected):
    prediction = store_of(tokens, n=2).predict([5])
    assert prediction is not None
    assert prediction.token == expected
    assert prediction.confidence == 0.5


def test_unknown_context_predicts_nothing():
    store = store_of([1, 2, 3], n=3)
    assert store.predict([9]) is None
    assert store.predict([]) is None
    assert NGramStore().predict([1, 2, 3]) is None


def test_add_from_start_counts_only_new_grams():
    store = NGramStore(3)
    store.add([1, 2, 3, 4, 5], start=3)  # grams ending at 4 and 5 only
    assert store.predict([2]) is None
    assert store.predict([3]) == Prediction(4, 1.0, 2)
    assert store.predict([3, 4]) == Prediction(5, 1.0, 3)


def test_store_needs_n_of_at_least_two():
    with pytest.raises(BadInputError, match="n=1"):
        NGramStore(1)


def propose(drafter: NGramDrafter, tokens: list[int], k: int) -> tuple[list[int], list[float]]:
    proposal = drafter.propose(DraftRequest(tokens, k, GREEDY))
    assert proposal.draft_probs is None and proposal.tokens.dtype == torch.int64
    assert proposal.confidence is not None and len(proposal.confidence) == len(proposal)
    return proposal.tokens.tolist(), [round(c, 6) for c in proposal.confidence.tolist()]


def test_drafter_chains_predictions_up_to_k():
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    drafter = NGramDrafter(n=3)
    drafter.begin(prompt)
    assert propose(drafter, prompt, 5) == ([3, 1, 2, 3, 1], [1.0] * 5)
    assert propose(drafter, prompt, 2) == ([3, 1], [1.0, 1.0])


def test_drafter_confidence_is_the_relative_frequency():
    prompt = [1, 2, 1, 3, 1, 2, 1]
    drafter = NGramDrafter(n=2)
    drafter.begin(prompt)
    # (1,) -> {2: 2, 3: 1}; (2,) -> {1: 2}
    assert propose(drafter, prompt, 3) == ([2, 1, 2], [round(2 / 3, 6), 1.0, round(2 / 3, 6)])


def test_min_confidence_stops_drafting():
    prompt = [1, 2, 1, 3, 1, 2, 1]
    drafter = NGramDrafter(n=2, min_confidence=0.7)
    drafter.begin(prompt)
    assert propose(drafter, prompt, 3) == ([], [])


def test_stop_fallback_gives_an_empty_proposal():
    drafter = NGramDrafter(n=3)
    drafter.begin([4, 5, 7])
    assert propose(drafter, [4, 5, 7], 4) == ([], [])


def test_shared_fallback_uses_the_shared_store():
    shared = store_of([7, 8, 9], n=3)
    drafter = NGramDrafter(n=3, fallback="shared", shared=shared)
    drafter.begin([4, 5, 7])
    # The request's own store knows nothing after 7; the shared one knows 7 -> 8 -> 9.
    assert propose(drafter, [4, 5, 7], 4) == ([8, 9], [1.0, 1.0])
    # The request's own store comes first when it knows the context.
    drafter.begin([7, 3, 7])
    assert propose(drafter, [7, 3, 7], 1) == ([3], [1.0])


def test_target_fallback_drafts_the_targets_guesses_where_the_store_knows_nothing():
    drafter = NGramDrafter(n=3, fallback="target")
    assert drafter.needs_target_guesses
    drafter.begin([4, 5, 7])
    assert propose(drafter, [4, 5, 7], 4) == ([], [])  # no pass yet: no guesses
    # A step drafted [9, 9, 9], accepted none; the target gave 6, then guessed 8, 3 after.
    drafter.commit(
        StepFeedback(proposed=3, accepted=0, new_tokens=[6], tokens=[4, 5, 7, 6],
                     target_guesses=(8, 3))
    )  # fmt: skip
    assert propose(drafter, [4, 5, 7, 6], 4) == ([8, 3], [0.0, 0.0])
    # A step with no rejection leaves no guesses: the draft is the store's alone.
    history = [4, 5, 7, 6, 4, 5]
    drafter.commit(StepFeedback(proposed=0, accepted=0, new_tokens=[4, 5], tokens=history))
    tokens, _ = propose(drafter, history, 2)
    assert tokens == [7, 6]
    # Guesses are for the step after the one that made them only.
    drafter.commit(StepFeedback(proposed=2, accepted=2, new_tokens=[7, 6, 1], tokens=[]))
    assert drafter._guesses == ()


def test_other_fallbacks_ignore_the_targets_guesses():
    drafter = NGramDrafter(n=3)
    assert not drafter.needs_target_guesses
    drafter.begin([4, 5, 7])
    drafter.commit(StepFeedback(proposed=1, accepted=0, new_tokens=[6], tokens=[4, 5, 7, 6],
                                target_guesses=(8,)))  # fmt: skip
    assert propose(drafter, [4, 5, 7, 6], 2) == ([], [])


def test_commit_updates_the_store_and_begin_resets_it():
    drafter = NGramDrafter(n=3)
    drafter.begin([1, 2])
    assert propose(drafter, [1, 2], 2) == ([], [])
    drafter.commit(StepFeedback(proposed=0, accepted=0, new_tokens=[1, 2], tokens=[1, 2, 1, 2]))
    assert propose(drafter, [1, 2, 1, 2], 3) == ([1, 2, 1], [1.0, 1.0, 1.0])
    drafter.begin([3, 4])
    assert propose(drafter, [3, 4], 2) == ([], [])


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"fallback": "bogus"}, "'bogus'"),
        ({"fallback": "shared"}, "shared NGramStore"),
        ({"min_confidence": 1.5}, "1.5"),
        ({"min_confidence": -0.1}, "-0.1"),
        ({"n": 1}, "n=1"),
    ],
)
def test_bad_arguments_raise(kwargs, shown):
    with pytest.raises(BadInputError, match=shown):
        NGramDrafter(**kwargs)
