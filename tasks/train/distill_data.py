"""Batches and the loss for distilling a model draft on teacher data
(see :mod:`tasks.train.teacher`).

Position ``i`` of a teacher sequence feeds token ``x_i``; its label is the target's
next-token prediction after ``x_i``: ``top_ids[i, 0]`` (the target's greedy token) for the
``"ce"`` loss, the target's top-k log-probs ``top_logprobs[i]`` for ``"kl"``. A sequence of
``T`` tokens has ``T - 1`` labelled positions (after the last token the target's prediction
continues past what was recorded; after an EOS it is meaningless), the same positions and
windows :mod:`tasks.train.head_data` cuts, so its window sampling is reused.

``"kl"`` is the forward KL from the target's renormalised top-k distribution ``p`` to the
draft's full-vocabulary distribution ``q``: ``sum_j p_j (log p_j - log q_j)`` over the k ids.
The draft's mass outside the k ids is pushed down through the softmax; the loss is >= 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Literal

import torch

from tasks.train.masked_labels import unmasked_labels
from tasks.train.teacher import TeacherSequence

LossKind = Literal["ce", "kl"]


@dataclass(frozen=True)
class DistillBatch:
    input_ids: torch.Tensor  # [batch, len] x_i, right-padded with 0
    attention_mask: torch.Tensor  # [batch, len] 1 on real tokens
    top_ids: torch.Tensor  # [batch, len, top_k] the target's top next tokens after x_i
    top_logprobs: torch.Tensor  # [batch, len, top_k]
    valid: torch.Tensor  # [batch, len] bool, a labelled position (not padding)
    answer: torch.Tensor  # [batch, len] bool, the label is an answer token (not the prompt's)

    def to(self, device: torch.device | str) -> DistillBatch:
        return DistillBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @property
    def tokens(self) -> int:
        return int(self.valid.sum())


def make_batch(
    windows: Sequence[tuple[TeacherSequence, int]], max_len: int, *, answers_only: bool = False
) -> DistillBatch:
    """Stack ``(sequence, start)`` windows of up to ``max_len`` labelled positions each."""
    lengths = [min(s.tokens.shape[0] - 1 - start, max_len) for s, start in windows]
    width, rows = max(lengths), len(windows)
    top_k = windows[0][0].top_ids.shape[1]
    input_ids = torch.zeros(rows, width, dtype=torch.int64)
    attention_mask = torch.zeros(rows, width, dtype=torch.int64)
    top_ids = torch.zeros(rows, width, top_k, dtype=torch.int64)
    top_logprobs = torch.zeros(rows, width, top_k)
    valid = torch.zeros(rows, width, dtype=torch.bool)
    answer = torch.zeros(rows, width, dtype=torch.bool)
    for row, ((sequence, start), length) in enumerate(zip(windows, lengths, strict=True)):
        here = slice(start, start + length)  # positions i
        input_ids[row, :length] = sequence.tokens[here]
        attention_mask[row, :length] = 1
        top_ids[row, :length] = sequence.top_ids[here]
        top_logprobs[row, :length] = sequence.top_logprobs[here]
        # Padding and the positions that touch redaction's mask token are out of the loss.
        valid[row, :length] = unmasked_labels(sequence, start, length, reach=1)
        # The label at i predicts x_{i+1}: an answer token once i + 1 >= prompt_len.
        answer[row, :length] = torch.arange(start, start + length) + 1 >= sequence.prompt_len
    if answers_only:
        valid &= answer
    return DistillBatch(input_ids, attention_mask, top_ids, top_logprobs, valid, answer)


@dataclass(frozen=True)
class DistillLoss:
    loss: torch.Tensor  # scalar, mean over valid positions
    correct: torch.Tensor  # scalar int, answer positions where the draft's top token agrees
    answer_positions: torch.Tensor  # scalar int


def distill_loss(model: torch.nn.Module, batch: DistillBatch, loss: LossKind) -> DistillLoss:
    """The draft's loss on ``batch`` and its top-1 agreement with the target."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    draft_logprobs = logits.float().log_softmax(dim=-1)  # [batch, len, vocab]
    if loss == "ce":
        greedy = batch.top_ids[..., :1]  # [batch, len, 1] the target's greedy token
        per_position = -draft_logprobs.gather(-1, greedy).squeeze(-1)  # [batch, len]
    else:
        teacher_logprobs = batch.top_logprobs.log_softmax(dim=-1)  # [batch, len, top_k]
        draft_at_top = draft_logprobs.gather(-1, batch.top_ids)  # [batch, len, top_k]
        per_position = (teacher_logprobs.exp() * (teacher_logprobs - draft_at_top)).sum(-1)
    weights = batch.valid.float()  # [batch, len]
    mean = (per_position * weights).sum() / weights.sum().clamp(min=1.0)
    scored = batch.answer & (batch.attention_mask > 0)  # [batch, len]
    agrees = logits.argmax(dim=-1) == batch.top_ids[..., 0]  # [batch, len]
    return DistillLoss(mean, (agrees & scored).sum(), scored.sum())
