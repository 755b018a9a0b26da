"""The draft head's reduced vocabulary: the tokens the target actually produces.

A head's logits over the full 49152-token vocabulary cost about as much as the rest of the
head; restricted to the most frequent few thousand tokens of the training traffic, a draft
step is about three times cheaper, and a draft outside that set would rarely be accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from serving.errors import BadInputError
from tasks.train.teacher import TeacherSequence


def token_counts(sequences: Sequence[TeacherSequence], vocab_size: int) -> torch.Tensor:
    """``[vocab_size]`` how often each token is the target's greedy next token."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for sequence in sequences:
        counts += torch.bincount(sequence.top_ids[:, 0], minlength=vocab_size)[:vocab_size]
    return counts


def build_reduced_vocab(
    sequences: Sequence[TeacherSequence],
    size: int,
    *,
    vocab_size: int,
    eos_token_ids: Sequence[int] = (),
) -> torch.Tensor:
    """The ``size`` most frequent greedy next tokens of the teacher data, always including
    ``eos_token_ids``; ties go to the lower id. Returns sorted ``[size]`` int64 ids."""
    eos = sorted({int(t) for t in eos_token_ids})
    if not 1 <= size <= vocab_size:
        raise BadInputError(f"draft_vocab_size must be in [1, {vocab_size}], got {size!r}")
    if len(eos) > size:
        raise BadInputError(
            f"draft_vocab_size={size} cannot hold the {len(eos)} EOS ids {eos}; raise it"
        )
    bad = [t for t in eos if not 0 <= t < vocab_size]
    if bad:
        raise BadInputError(f"EOS ids {bad} are outside the vocabulary [0, {vocab_size})")
    counts = token_counts(sequences, vocab_size)
    counts[eos] = -1  # ranked last, so the first vocab_size - len(eos) ids are the others
    # Stable sort by descending count: ties keep ascending id order.
    ranked = torch.sort(-counts, stable=True).indices[: vocab_size - len(eos)]
    ranked = ranked[: size - len(eos)]
    chosen = torch.cat([torch.tensor(eos, dtype=torch.int64), ranked])
    return torch.sort(chosen).values
