from __future__ import annotations

import pytest
import torch

from serving.errors import BadInputError
from tasks.train.draft_vocab import build_reduced_vocab, token_counts
from tasks.train.teacher import TeacherSequence


def sequence(next_tokens: list[int]) -> TeacherSequence:
    """A teacher sequence whose target's greedy next tokens are ``next_tokens``."""
    count = len(next_tokens)
    top_ids = torch.tensor(next_tokens)[:, None].repeat(1, 2)
    return TeacherSequence(
        prompt_id="s",
        tokens=torch.zeros(count, dtype=torch.int64),
        features=torch.zeros(count, 4),
        top_ids=top_ids,
        top_logprobs=torch.zeros(count, 2),
        prompt_len=1,
    )


DATA = [sequence([5, 5, 5, 7, 7, 9]), sequence([9, 9, 3, 5])]


def test_counts_the_greedy_next_tokens():
    counts = token_counts(DATA, 12)
    assert counts.tolist() == [0, 0, 0, 1, 0, 4, 0, 2, 0, 3, 0, 0]


def test_top_tokens_plus_eos_sorted_by_id():
    assert build_reduced_vocab(DATA, 3, vocab_size=12).tolist() == [5, 7, 9]
    # EOS always makes it in, taking a slot from the least frequent.
    assert build_reduced_vocab(DATA, 3, vocab_size=12, eos_token_ids=[11]).tolist() == [5, 9, 11]
    # Ties (here: unseen tokens) go to the lower id.
    assert build_reduced_vocab(DATA, 6, vocab_size=12).tolist() == [0, 1, 3, 5, 7, 9]
    full = build_reduced_vocab(DATA, 12, vocab_size=12, eos_token_ids=[2])
    assert full.tolist() == list(range(12))


@pytest.mark.parametrize(
    ("size", "eos", "fragment"),
    [
        (0, [], "draft_vocab_size must be in"),
        (13, [], "draft_vocab_size must be in"),
        (1, [1, 2], "cannot hold the 2 EOS ids"),
        (3, [40], "outside the vocabulary"),
    ],
)
def test_bad_sizes_are_refused(size, eos, fragment):
    with pytest.raises(BadInputError, match=fragment):
        build_reduced_vocab(DATA, size, vocab_size=12, eos_token_ids=eos)
