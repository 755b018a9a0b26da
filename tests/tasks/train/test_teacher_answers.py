"""The standalone answer writer: the target's greedy answers, in prompt order, resumable."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from tasks.train.teacher_answers import greedy_answers, read_jsonl, write_answers

EOS = 2


def prompts(n: int) -> list[dict]:
    generator = torch.Generator().manual_seed(3)
    return [
        {
            "id": f"p{i}",
            "token_ids": torch.randint(3, 96, (4 + i % 3,), generator=generator).tolist(),
        }
        for i in range(n)
    ]


def test_writes_each_prompts_greedy_answer(target, tmp_path):
    chosen = prompts(5)
    out = tmp_path / "answers.jsonl"
    answer = functools.partial(
        greedy_answers, target, max_new_tokens=6, eos_token_ids=[EOS], pad_token_id=0
    )
    generated = write_answers(answer, chosen, out, batch_size=2, progress=False)
    rows = {row["id"]: row["answer_ids"] for row in read_jsonl(out, ("id", "answer_ids"))}
    assert set(rows) == {p["id"] for p in chosen} and generated == sum(map(len, rows.values()))
    for prompt in chosen:  # batching (and its padding) changes no answer
        alone = greedy_answers(
            target, [prompt["token_ids"]], max_new_tokens=6, eos_token_ids=[EOS], pad_token_id=0
        )
        assert rows[prompt["id"]] == alone[0]


def test_resume_keeps_the_answers_of_an_interrupted_run(target, tmp_path):
    chosen = prompts(4)
    out = tmp_path / "answers.jsonl"
    partial = tmp_path / ".answers.jsonl.partial"
    partial.write_text(json.dumps({"id": "p0", "answer_ids": [7, 7]}) + "\n")
    answer = functools.partial(
        greedy_answers, target, max_new_tokens=4, eos_token_ids=[EOS], pad_token_id=0
    )
    write_answers(answer, chosen, out, batch_size=4, resume=True, progress=False)
    rows = {row["id"]: row["answer_ids"] for row in read_jsonl(out, ("id", "answer_ids"))}
    assert rows["p0"] == [7, 7] and len(rows) == 4  # kept, not generated again
    assert not partial.exists()


def test_a_bad_line_is_named(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": "a", "token_ids": [1]}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=r"prompts.jsonl:2 lacks \['token_ids'\]"):
        read_jsonl(path, ("id", "token_ids"))
    path.write_text("not json\n")
    with pytest.raises(ValueError, match=r"prompts.jsonl:1 is not JSON"):
        read_jsonl(path, ("id", "token_ids"))
