"""Which labelled positions of a teacher sequence stay out of the loss: redaction's.

Captured traffic is redacted before it is stored (:mod:`serving.security.redact`): each
token that carried a secret became the mask token (SmolLM2: ``<|endoftext|>``, id 0). A
draft must never learn to propose that token, nor learn what follows it, so a labelled
position is left out of every loss and metric when a token it reads or predicts is the
mask token, or when the target's own top choice there is (after a run of masks the target
may well predict another).

A labelled position ``i`` reads tokens ``i .. i + reach - 1`` and its label is the target's
distribution in row ``i + reach - 1``, which predicts token ``i + reach``: ``reach`` is 1
for a distilled model draft (:mod:`tasks.train.distill_data`: ``x_i`` -> ``x_{i+1}``) and
2 for the head (:mod:`tasks.train.head_data`: ``f_i, x_{i+1}`` -> ``x_{i+2}``).
"""

from __future__ import annotations

import torch

from tasks.train.teacher import TeacherSequence


def unmasked_labels(
    sequence: TeacherSequence, start: int, length: int, *, reach: int
) -> torch.Tensor:
    """``[length]`` bool: True where labelled position ``start + j`` touches no mask token
    (all True when the sequence has no mask token)."""
    keep = torch.ones(length, dtype=torch.bool)
    mask_id = sequence.mask_token_id
    if mask_id is None or length <= 0:
        return keep
    tokens = sequence.tokens
    masked = tokens == mask_id  # [seq]
    for offset in range(reach + 1):  # the tokens read (offset < reach) and the one predicted
        here = masked[start + offset : start + offset + length]  # shorter at the sequence's end
        keep[: here.shape[0]] &= ~here
    label_rows = sequence.top_ids[start + reach - 1 : start + reach - 1 + length, 0]
    keep[: label_rows.shape[0]] &= label_rows != mask_id
    return keep
