"""The draft head's EAGLE-style loss and its metrics, on one :class:`HeadBatch`.

Step 1 (teacher-forced): the head reads true features ``f_i`` and predicts ``f̂_{i+1}``.
Its loss is ``feature_weight * smooth_l1(f̂_{i+1}, f_{i+1}) + token_weight * token_loss``,
where the token loss is the cross-entropy of the head's logits (through the target's frozen
output layer, over the reduced vocabulary if any) against the target's greedy next token
(``top1``) or its renormalised top-k distribution (``topk``).

Steps 2..D (EAGLE-3's "training-time test", unrolled ``depths`` deep): at step ``s``
position ``j`` reads the head's own step-``s - 1`` prediction ``f̂_j`` (that step's output
at ``j - 1``) instead of ``f_j``, and attends to what the ``s``-th draft of a serving step
sees: the step-1 keys of positions ``< j - s + 2`` (true features, through the KV cache),
the step-``d`` key at ``j - s + d`` for each ``d`` from 2 to ``s - 1``, and itself
(:func:`depth_mask`). Each deeper step's loss, with the same targets, is weighted by
``second_step_weight``.

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


MAX_DEPTHS = 8  # the deepest training unroll and replay (a policy's k beyond it is rare)


def depth_mask(length: int, depth: int, device: torch.device | None = None) -> torch.Tensor:
    """``[1, 1, length, depth * length]``: what query ``j`` of step ``depth`` (>= 2) sees in
    the cache of steps ``1..depth - 1`` and its own keys: step-1 keys ``< j - depth + 2``,
    the step-``d`` key at ``j - depth + d`` for ``d`` in ``2..depth - 1``, and its own key at
    ``j`` (step 2: step-1 keys ``< j`` and itself)."""
    query = torch.arange(length, device=device)[:, None]  # [len, 1]
    key = torch.arange(length, device=device)[None, :]  # [1, len]
    blocks = [key < query - depth + 2]
    blocks += [key == query - depth + d for d in range(2, depth + 1)]
    return torch.cat(blocks, dim=1)[None, None]


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
    steps: list[StepLoss]  # step 1 (true features), then each deeper step

    @property
    def first(self) -> StepLoss:
        return self.steps[0]

    @property
    def second(self) -> StepLoss | None:
        return self.steps[1] if len(self.steps) > 1 else None


def head_predictions(
    head: DraftHead, batch: HeadBatch, target: FrozenTarget, *, depths: int
) -> list[torch.Tensor]:
    """Each step's predictions ``[batch, len, hidden]``, ``depths`` deep at most: step 1's
    ``f̂_{i+1}`` from true features, then each deeper step's from the step before it
    (positions ``< step - 1`` of step ``step`` are meaningless); fewer steps when the
    window is shorter than ``depths``."""
    if not 1 <= depths <= MAX_DEPTHS:
        raise ValueError(f"depths must be between 1 and {MAX_DEPTHS}, got {depths!r}")
    length = batch.positions.shape[1]
    device = batch.features.device
    embeds = F.embedding(batch.next_tokens, target.embed)  # [batch, len, hidden]
    depths = min(depths, length)
    cache = DynamicCache(config=head.config) if depths > 1 else None
    steps = [head(batch.features, embeds, batch.positions, causal_mask(length, 0, device), cache)]
    for depth in range(2, depths + 1):
        # Position j reads f̂_j: the step before's output at j - 1 (position 0 has none).
        shifted = torch.cat([batch.features[:, :1], steps[-1][:, :-1]], dim=1)
        mask = depth_mask(length, depth, device)
        steps.append(head(shifted, embeds, batch.positions, mask, cache))
    return steps


def head_loss(
    head: DraftHead,
    batch: HeadBatch,
    target: FrozenTarget,
    *,
    feature_weight: float = 1.0,
    token_weight: float = 0.1,
    token_loss: str = "topk",
    second_step_weight: float = 0.0,
    depths: int = 2,
) -> HeadLoss:
    """The loss of step 1 plus ``second_step_weight`` times each deeper step's, ``depths``
    steps in all (``second_step_weight`` 0: step 1 alone)."""
    predicted = head_predictions(
        head, batch, target, depths=depths if second_step_weight > 0 else 1
    )
    steps = [step_loss(predicted[0], batch, target, batch.valid, token_loss)]
    total = feature_weight * steps[0].feature + token_weight * steps[0].token
    for depth, prediction in enumerate(predicted[1:], start=2):
        valid = batch.valid.clone()
        valid[:, : depth - 1] = False  # no step ``depth`` draft starts before the window
        step = step_loss(prediction, batch, target, valid, token_loss)
        total = total + second_step_weight * (
            feature_weight * step.feature + token_weight * step.token
        )
        steps.append(step)
    return HeadLoss(total, steps)
