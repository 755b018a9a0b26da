"""The draft head's EAGLE-style loss and its metrics, on one :class:`HeadBatch`.

Step 1 (teacher-forced): the head reads true features ``f_i`` and predicts ``f̂_{i+1}``.
Its loss is ``feature_weight * smooth_l1(f̂_{i+1}, f_{i+1}) + token_weight * token_loss``,
where the token loss is the cross-entropy of the head's logits (through the target's frozen
output layer, over the reduced vocabulary if any) against the target's greedy next token
(``top1``) or its renormalised top-k distribution (``topk``).

Step 2 (a cheap "training-time test"): position ``j`` reads the head's own step-1
prediction ``f̂_j`` instead of ``f_j`` and attends to the step-1 keys of positions ``< j``
(through the step-1 KV cache) and to itself, exactly what the second draft of a serving
step sees. Its loss, with the same targets, is weighted by ``second_step_weight``.

Agreement is the fraction of answer positions where the head's top token (mapped back to
full-vocabulary ids) equals the target's greedy next token; a label outside the reduced
vocabulary counts as a miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from serving.models.head import DraftHead, causal_mask, output_weight
from tasks.train.head_data import HeadBatch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

IGNORE = -100


@dataclass(frozen=True)
class FrozenTarget:
    """The target's frozen tensors the head trains against (on the training device)."""

    embed: torch.Tensor  # [vocab, hidden] input embedding
    output_rows: torch.Tensor  # [draft_vocab, hidden] output layer rows of the head's vocab
    vocab_ids: torch.Tensor | None  # [draft_vocab] full ids, None: the full vocabulary
    reduced_index: torch.Tensor | None  # [vocab] full id -> reduced index, or IGNORE

    def to(self, device: torch.device | str) -> FrozenTarget:
        def move(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device)

        return FrozenTarget(
            self.embed.to(device),
            self.output_rows.to(device),
            move(self.vocab_ids),
            move(self.reduced_index),
        )


def frozen_target(target: PreTrainedModel, vocab_ids: torch.Tensor | None) -> FrozenTarget:
    """``target``'s input embedding and output-layer rows (of ``vocab_ids``, or all)."""
    embed = target.get_input_embeddings().weight.detach().float()  # type: ignore[operator]
    output = output_weight(target).detach().float()
    if vocab_ids is None:
        return FrozenTarget(embed, output, None, None)
    reduced_index = torch.full((output.shape[0],), IGNORE, dtype=torch.int64)
    reduced_index[vocab_ids] = torch.arange(vocab_ids.shape[0])
    return FrozenTarget(embed, output[vocab_ids], vocab_ids, reduced_index)


def second_step_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """``[1, 1, length, 2 * length]``: query ``j`` of step 2 sees step-1 keys ``< j`` (the
    cache's first half) and its own key (``length + j``)."""
    query = torch.arange(length, device=device)[:, None]  # [len, 1]
    key = torch.arange(length, device=device)[None, :]  # [1, len]
    return torch.cat([key < query, key == query], dim=1)[None, None]


@dataclass(frozen=True)
class StepLoss:
    feature: torch.Tensor  # scalar, mean smooth-L1 over valid positions
    token: torch.Tensor  # scalar, mean token loss over valid positions
    correct: torch.Tensor  # scalar int, answer positions where the head's top token agrees
    answer_positions: torch.Tensor  # scalar int


def step_loss(
    predicted: torch.Tensor,  # [batch, len, hidden]
    batch: HeadBatch,
    target: FrozenTarget,
    valid: torch.Tensor,  # [batch, len] bool
    token_loss: str,
) -> StepLoss:
    weight = valid.float()
    count = weight.sum().clamp(min=1.0)
    feature = F.smooth_l1_loss(predicted, batch.target_features, reduction="none").mean(-1)
    feature = (feature * weight).sum() / count
    logits = predicted @ target.output_rows.T  # [batch, len, draft_vocab]
    log_probs = logits.float().log_softmax(dim=-1)
    ids = batch.top_ids  # [batch, len, top_k] full ids
    index = ids if target.reduced_index is None else target.reduced_index[ids]
    inside = index != IGNORE  # [batch, len, top_k]
    if token_loss == "top1":
        labels = index[..., 0].masked_fill(~valid, IGNORE)  # [batch, len]
        token = F.nll_loss(
            log_probs.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum"
        ) / (labels != IGNORE).sum().clamp(min=1)
    else:
        teacher = batch.top_logprobs.masked_fill(~inside, float("-inf")).softmax(dim=-1)
        teacher = teacher.nan_to_num(0.0)  # no top-k token inside the vocabulary: no signal
        picked = log_probs.gather(-1, index.clamp(min=0))  # [batch, len, top_k]
        token = -(teacher * picked.masked_fill(~inside, 0.0)).sum(-1)
        token = (token * weight).sum() / count
    head_top = logits.argmax(dim=-1)  # [batch, len] reduced index
    if target.vocab_ids is not None:
        head_top = target.vocab_ids[head_top]
    scored = batch.answer & valid
    correct = ((head_top == ids[..., 0]) & scored).sum()
    return StepLoss(feature, token, correct, scored.sum())


@dataclass(frozen=True)
class HeadLoss:
    total: torch.Tensor  # scalar, what is minimised
    first: StepLoss
    second: StepLoss | None


def head_predictions(
    head: DraftHead, batch: HeadBatch, target: FrozenTarget, *, two_steps: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step-1 predictions ``f̂_{i+1}`` ``[batch, len, hidden]`` and, with ``two_steps``,
    step-2 predictions from the head's own features (position 0 is meaningless)."""
    length = batch.positions.shape[1]
    device = batch.features.device
    embeds = F.embedding(batch.next_tokens, target.embed)  # [batch, len, hidden]
    two_steps = two_steps and length > 1
    cache = DynamicCache(config=head.config) if two_steps else None
    predicted = head(
        batch.features, embeds, batch.positions, causal_mask(length, 0, device), cache
    )  # [batch, len, hidden]
    if not two_steps:
        return predicted, None
    # Position j reads f̂_j (step 1's output at j - 1); position 0 has none.
    shifted = torch.cat([batch.features[:, :1], predicted[:, :-1]], dim=1)
    predicted_again = head(
        shifted, embeds, batch.positions, second_step_mask(length, device), cache
    )  # [batch, len, hidden]
    return predicted, predicted_again


def head_loss(
    head: DraftHead,
    batch: HeadBatch,
    target: FrozenTarget,
    *,
    feature_weight: float = 1.0,
    token_weight: float = 0.1,
    token_loss: str = "topk",
    second_step_weight: float = 0.0,
) -> HeadLoss:
    predicted, predicted_again = head_predictions(
        head, batch, target, two_steps=second_step_weight > 0
    )
    first = step_loss(predicted, batch, target, batch.valid, token_loss)
    total = feature_weight * first.feature + token_weight * first.token
    second = None
    if predicted_again is not None:
        valid = batch.valid.clone()
        valid[:, 0] = False
        second = step_loss(predicted_again, batch, target, valid, token_loss)
        total = total + second_step_weight * (
            feature_weight * second.feature + token_weight * second.token
        )
    return HeadLoss(total, first, second)
