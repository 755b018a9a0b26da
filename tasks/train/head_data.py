"""Training windows for the draft head, cut from teacher sequences.

Head position ``i`` of a sequence pairs the target's feature ``f_i`` with the next token
``x_{i+1}``; its targets are the next feature ``f_{i+1}`` and the target's next-token
distribution at ``i + 1`` (the token after ``x_{i+1}``). A sequence of ``T`` tokens has
``T - 1`` head positions; a window covers at most ``max_len`` of them and is right-padded
inside its batch (padding is masked out of every loss and metric, as are the positions
that touch redaction's mask token, :mod:`tasks.train.masked_labels`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import torch

from serving.errors import BadInputError
from tasks.train.masked_labels import unmasked_labels
from tasks.train.teacher import TeacherSequence


@dataclass(frozen=True)
class HeadBatch:
    features: torch.Tensor  # [batch, len, hidden] f_i
    next_tokens: torch.Tensor  # [batch, len] x_{i+1}
    target_features: torch.Tensor  # [batch, len, hidden] f_{i+1}
    top_ids: torch.Tensor  # [batch, len, top_k] the target's top tokens after x_{i+1}
    top_logprobs: torch.Tensor  # [batch, len, top_k]
    positions: torch.Tensor  # [batch, len] i
    valid: torch.Tensor  # [batch, len] bool, False on padding
    answer: torch.Tensor  # [batch, len] bool, the label is an answer token (not the prompt's)

    def to(self, device: torch.device | str) -> HeadBatch:
        return HeadBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @property
    def tokens(self) -> int:
        return int(self.valid.sum())


def split_sequences(
    sequences: Sequence[TeacherSequence], eval_fraction: float
) -> tuple[list[TeacherSequence], list[TeacherSequence]]:
    """``(train, heldout)`` by a stable hash of each prompt id; with ``eval_fraction > 0``
    and at least two sequences, at least one is held out."""
    usable = [s for s in sequences if s.tokens.shape[0] >= 2]
    if not usable:
        raise BadInputError(
            "the teacher data is empty (no sequence of two or more tokens); build it from "
            "more prompts"
        )
    if eval_fraction <= 0:
        return usable, []

    def key(sequence: TeacherSequence) -> float:
        digest = hashlib.sha256(f"head-eval:{sequence.prompt_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    heldout = [s for s in usable if key(s) < eval_fraction]
    if not heldout and len(usable) >= 2:
        heldout = [min(usable, key=key)]
    held_ids = {s.prompt_id for s in heldout}
    train = [s for s in usable if s.prompt_id not in held_ids]
    if not train:
        raise BadInputError(
            f"eval_fraction={eval_fraction} leaves no training sequence out of {len(usable)}; "
            "lower it or build more teacher data"
        )
    return train, heldout


def make_batch(
    windows: Sequence[tuple[TeacherSequence, int]], max_len: int, *, answers_only: bool = False
) -> HeadBatch:
    """Stack ``(sequence, start)`` windows of up to ``max_len`` head positions each."""
    lengths = [min(s.tokens.shape[0] - 1 - start, max_len) for s, start in windows]
    width = max(lengths)
    rows, hidden = len(windows), windows[0][0].features.shape[1]
    top_k = windows[0][0].top_ids.shape[1]
    features = torch.zeros(rows, width, hidden)
    target_features = torch.zeros(rows, width, hidden)
    next_tokens = torch.zeros(rows, width, dtype=torch.int64)
    top_ids = torch.zeros(rows, width, top_k, dtype=torch.int64)
    top_logprobs = torch.zeros(rows, width, top_k)
    positions = torch.zeros(rows, width, dtype=torch.int64)
    valid = torch.zeros(rows, width, dtype=torch.bool)
    answer = torch.zeros(rows, width, dtype=torch.bool)
    for row, ((sequence, start), length) in enumerate(zip(windows, lengths, strict=True)):
        here = slice(start, start + length)  # head positions i
        after = slice(start + 1, start + 1 + length)  # i + 1
        features[row, :length] = sequence.features[here]
        target_features[row, :length] = sequence.features[after]
        next_tokens[row, :length] = sequence.tokens[after]
        top_ids[row, :length] = sequence.top_ids[after]
        top_logprobs[row, :length] = sequence.top_logprobs[after]
        positions[row, :length] = torch.arange(start, start + length)
        # Padding and the positions that touch redaction's mask token are out of the loss.
        valid[row, :length] = unmasked_labels(sequence, start, length, reach=2)
        # The label at i is the token after x_{i+1}: an answer token once i + 2 >= prompt_len.
        answer[row, :length] = positions[row, :length] + 2 >= sequence.prompt_len
    if answers_only:
        valid &= answer
    return HeadBatch(
        features, next_tokens, target_features, top_ids, top_logprobs, positions, valid, answer
    )


def sample_windows(
    sequences: Sequence[TeacherSequence], batch_size: int, max_len: int, generator: torch.Generator
) -> list[tuple[TeacherSequence, int]]:
    """``batch_size`` random windows (sequence and start) drawn with ``generator``."""
    picks = torch.randint(len(sequences), (batch_size,), generator=generator).tolist()
    windows = []
    for index in picks:
        sequence = sequences[index]
        slack = max(sequence.tokens.shape[0] - 1 - max_len, 0)
        start = int(torch.randint(slack + 1, (1,), generator=generator))
        windows.append((sequence, start))
    return windows


def eval_windows(
    sequences: Sequence[TeacherSequence], batch_size: int, max_len: int
) -> Iterator[list[tuple[TeacherSequence, int]]]:
    """Every head position of ``sequences`` once, in consecutive windows, batched."""
    windows = [
        (sequence, start)
        for sequence in sequences
        for start in range(0, sequence.tokens.shape[0] - 1, max_len)
    ]
    for begin in range(0, len(windows), batch_size):
        yield windows[begin : begin + batch_size]
