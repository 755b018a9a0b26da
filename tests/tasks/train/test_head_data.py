from __future__ import annotations

import pytest
import torch

from serving.errors import BadInputError
from tasks.train.head_data import eval_windows, make_batch, sample_windows, split_sequences
from tasks.train.teacher import TeacherSequence

HIDDEN = 3


def sequence(prompt_id: str, length: int, prompt_len: int = 3) -> TeacherSequence:
    """Token ``t`` at position ``t``; feature ``f_t`` filled with ``t``; top ids ``100 + t``."""
    positions = torch.arange(length)
    return TeacherSequence(
        prompt_id=prompt_id,
        tokens=positions.clone(),
        features=positions[:, None].float().repeat(1, HIDDEN),
        top_ids=(100 + positions)[:, None].repeat(1, 2),
        top_logprobs=torch.zeros(length, 2),
        prompt_len=prompt_len,
    )


def test_a_window_pairs_each_feature_with_the_next_token_and_targets():
    batch = make_batch([(sequence("a", 8), 2), (sequence("b", 4), 0)], max_len=4)
    assert batch.positions.tolist() == [[2, 3, 4, 5], [0, 1, 2, 0]]
    assert batch.valid.tolist() == [[True] * 4, [True, True, True, False]]
    assert batch.features[0, :, 0].tolist() == [2, 3, 4, 5]  # f_i
    assert batch.next_tokens[0].tolist() == [3, 4, 5, 6]  # x_{i+1}
    assert batch.target_features[0, :, 0].tolist() == [3, 4, 5, 6]  # f_{i+1}
    assert batch.top_ids[0, :, 0].tolist() == [103, 104, 105, 106]  # the token after x_{i+1}
    # The label at i is an answer token once i + 2 >= prompt_len (3).
    assert batch.answer[1].tolist() == [False, True, True, False]
    assert batch.tokens == 7
    only_answers = make_batch([(sequence("b", 4), 0)], max_len=4, answers_only=True)
    assert only_answers.valid.tolist() == [[False, True, True]]


def test_split_is_stable_and_holds_out_at_least_one():
    data = [sequence(f"s{i}", 5) for i in range(20)]
    train, heldout = split_sequences(data, 0.25)
    again = split_sequences(list(reversed(data)), 0.25)
    assert {s.prompt_id for s in heldout} == {s.prompt_id for s in again[1]}
    assert heldout and len(train) + len(heldout) == 20
    assert not {s.prompt_id for s in train} & {s.prompt_id for s in heldout}
    train, heldout = split_sequences(data[:2], 0.01)
    assert len(train) == 1 and len(heldout) == 1
    assert split_sequences(data, 0.0) == (data, [])


def test_empty_data_is_refused():
    with pytest.raises(BadInputError, match="teacher data is empty"):
        split_sequences([], 0.1)
    with pytest.raises(BadInputError, match="teacher data is empty"):
        split_sequences([sequence("one-token", 1, prompt_len=1)], 0.1)


def test_eval_windows_cover_every_position_once():
    data = [sequence("a", 10), sequence("b", 3)]
    seen: dict[str, list[int]] = {"a": [], "b": []}
    for windows in eval_windows(data, batch_size=2, max_len=4):
        batch = make_batch(windows, max_len=4)
        for row, (s, _) in enumerate(windows):
            seen[s.prompt_id] += batch.positions[row][batch.valid[row]].tolist()
    assert seen == {"a": list(range(9)), "b": [0, 1]}


def test_sampled_windows_are_reproducible():
    data = [sequence(f"s{i}", 30) for i in range(5)]
    first = sample_windows(data, 4, 8, torch.Generator().manual_seed(1))
    again = sample_windows(data, 4, 8, torch.Generator().manual_seed(1))
    assert [(s.prompt_id, start) for s, start in first] == [
        (s.prompt_id, start) for s, start in again
    ]
    assert all(0 <= start <= 30 - 1 - 8 for _, start in first)
