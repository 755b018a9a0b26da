from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from serving.models.head import DraftHead, causal_mask, head_config_for
from tasks.train.head_data import make_batch
from tasks.train.head_loss import frozen_target, head_loss, head_predictions, step_loss
from tasks.train.teacher import TeacherSequence


@pytest.fixture(scope="module")
def teacher_sequence(target) -> TeacherSequence:
    """The tiny target's own record of a random 14-token sequence (prompt of 4)."""
    tokens = torch.randint(3, 96, (14,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = target(tokens[None], output_hidden_states=True)
    top = out.logits[0].log_softmax(-1).topk(4)
    return TeacherSequence(
        "s", tokens, out.hidden_states[-1][0].clone(), top.indices, top.values, 4
    )


@pytest.fixture(scope="module")
def head(target) -> DraftHead:
    torch.manual_seed(0)
    return DraftHead(head_config_for(target, intermediate_size=48)).eval()


def test_second_step_sees_what_the_second_draft_sees(target, head, teacher_sequence):
    """Step 2 at position j == a cache of true pairs 0..j-1, then (f̂_j, x_{j+1}) fed at j."""
    frozen = frozen_target(target, None)
    batch = make_batch([(teacher_sequence, 0)], max_len=32)
    with torch.no_grad():
        first, second = head_predictions(head, batch, frozen, depths=2)
        embeds = target.get_input_embeddings()(batch.next_tokens)  # [1, len, hidden]
        for j in range(1, batch.positions.shape[1]):
            cache = DynamicCache(config=head.config)
            head(
                batch.features[:, :j],
                embeds[:, :j],
                batch.positions[:, :j],
                causal_mask(j, 0),
                cache,
            )
            drafted = head(
                first[:, j - 1 : j],
                embeds[:, j : j + 1],
                batch.positions[:, j : j + 1],
                None,
                cache,
            )
            torch.testing.assert_close(drafted[0, 0], second[0, j], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("depths", [3, 4])
def test_each_deeper_step_sees_what_that_draft_of_a_serving_step_sees(
    target, head, teacher_sequence, depths
):
    """Step ``d`` at position ``p`` == a cache of true pairs before the step's first draft
    at ``start = p - d + 1``, then each draft fed the head's own previous output, as the
    serving drafter chains them."""
    frozen = frozen_target(target, None)
    batch = make_batch([(teacher_sequence, 0)], max_len=32)
    with torch.no_grad():
        steps = head_predictions(head, batch, frozen, depths=depths)
        assert len(steps) == depths
        embeds = target.get_input_embeddings()(batch.next_tokens)  # [1, len, hidden]
        for start in range(batch.positions.shape[1] - depths + 1):
            cache = DynamicCache(config=head.config)
            if start:
                head(
                    batch.features[:, :start],
                    embeds[:, :start],
                    batch.positions[:, :start],
                    causal_mask(start, 0),
                    cache,
                )
            feature = batch.features[:, start : start + 1]
            for depth in range(depths):
                p = start + depth
                feature = head(
                    feature, embeds[:, p : p + 1], batch.positions[:, p : p + 1], None, cache
                )
                torch.testing.assert_close(feature[0, 0], steps[depth][0, p], rtol=1e-4, atol=1e-5)


def test_a_deeper_unroll_adds_each_steps_loss(target, head, teacher_sequence):
    frozen = frozen_target(target, None)
    batch = make_batch([(teacher_sequence, 0)], max_len=32)
    with torch.no_grad():
        two = head_loss(head, batch, frozen, second_step_weight=0.5, depths=2)
        four = head_loss(head, batch, frozen, second_step_weight=0.5, depths=4)
    assert len(two.steps) == 2 and len(four.steps) == 4
    extra = sum(0.5 * (s.feature + 0.1 * s.token) for s in four.steps[2:])
    torch.testing.assert_close(four.total, two.total + extra)
    # Step d scores no position before d - 1 (the answer's labels start at position 2).
    assert [int(s.answer_positions) for s in four.steps] == [11, 11, 11, 10]


def test_true_next_features_score_perfectly(target, teacher_sequence):
    frozen = frozen_target(target, None)
    batch = make_batch([(teacher_sequence, 0)], max_len=32)
    result = step_loss(batch.target_features, batch, frozen, batch.valid, "top1")
    assert float(result.feature) == 0.0
    assert int(result.correct) == int(result.answer_positions) == 13 - 2  # answer labels


def test_labels_outside_the_reduced_vocabulary_give_no_signal_and_count_as_misses(
    target, teacher_sequence
):
    used = set(teacher_sequence.top_ids.flatten().tolist())
    unused = torch.tensor(sorted(set(range(96)) - used)[:8])
    frozen = frozen_target(target, unused)
    batch = make_batch([(teacher_sequence, 0)], max_len=32)
    for token_loss in ("top1", "topk"):
        result = step_loss(batch.target_features, batch, frozen, batch.valid, token_loss)
        assert float(result.token) == 0.0
        assert int(result.correct) == 0


@pytest.mark.parametrize("token_loss", ["top1", "topk"])
def test_the_loss_has_gradients_only_for_the_head(target, head, teacher_sequence, token_loss):
    frozen = frozen_target(target, None)
    batch = make_batch([(teacher_sequence, 0), (teacher_sequence, 3)], max_len=8)
    head.zero_grad()
    loss = head_loss(head, batch, frozen, token_loss=token_loss, second_step_weight=0.5)
    assert loss.second is not None and torch.isfinite(loss.total)
    loss.total.backward()
    assert all(p.grad is not None for p in head.parameters())
    assert not frozen.embed.requires_grad and frozen.embed.grad is None
    head.zero_grad()
