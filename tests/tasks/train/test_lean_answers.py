"""The lean step's packed answers: each equals the request decoded alone, EOS kept, and the
resumable writer keeps an interrupted run's answers."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch

from serving.curves import BatchLimits
from serving.engine.decoder import SpeculativeDecoder
from serving.errors import BadInputError
from tasks.train.lean_answers import lean_answers
from tasks.train.teacher_answers import read_jsonl, write_answers
from tests.serving.lean.models import tiny_target


@pytest.fixture(scope="module")
def lean():
    return tiny_target("int4", num_layers=2)


def _prompts(n: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    return [
        torch.randint(3, 96, (3 + 5 * (i % 4),), generator=generator).tolist() for i in range(n)
    ]


def test_packed_answers_equal_each_request_alone(lean):
    prompts = _prompts(7)
    answers = lean_answers(lean, prompts, max_new_tokens=12, limits=BatchLimits(4, 24))
    for prompt, answer in zip(prompts, answers, strict=True):
        alone = SpeculativeDecoder(lean).generate(prompt, max_new_tokens=12).token_ids
        assert answer == list(alone)


def test_an_answer_ends_after_its_first_eos_kept(lean):
    prompt = _prompts(1)[0]
    plain = SpeculativeDecoder(lean).generate(prompt, max_new_tokens=10).token_ids
    eos = plain[4]
    ending = dataclasses.replace(lean, eos_token_ids=(eos,))
    answers = lean_answers(ending, [prompt], max_new_tokens=10, limits=BatchLimits(2, 16))
    assert answers == [list(plain[: plain.index(eos) + 1])]


def test_resume_keeps_an_interrupted_runs_answers_of_the_same_settings(lean, tmp_path):
    prompts = [{"id": f"p{i}", "token_ids": ids} for i, ids in enumerate(_prompts(5))]
    out = tmp_path / "answers.jsonl"
    (tmp_path / ".answers.jsonl.int4-6.partial").write_text(
        json.dumps({"id": "p1", "answer_ids": [5, 5]}) + "\n"
    )
    (tmp_path / ".answers.jsonl.int4-9.partial").write_text(  # other settings: not resumed
        json.dumps({"id": "p2", "answer_ids": [6]}) + "\n"
    )
    answer = functools.partial(lean_answers, lean, max_new_tokens=6, limits=BatchLimits(4, 32))
    generated = write_answers(
        answer, prompts, out, batch_size=2, resume=True, key="int4-6", progress=False
    )
    rows = read_jsonl(out, ("id", "answer_ids"))
    assert sorted(row["id"] for row in rows) == [f"p{i}" for i in range(5)]  # none twice
    answers = {row["id"]: row["answer_ids"] for row in rows}
    assert answers["p1"] == [5, 5] and answers["p2"] != [6]
    assert generated == 4 * 6
    assert not (tmp_path / ".answers.jsonl.int4-6.partial").exists()


def test_a_prompt_past_the_context_is_named(lean):
    with pytest.raises(BadInputError, match="run past the target's"):
        lean_answers(lean, [[3] * 510], max_new_tokens=8, limits=BatchLimits(2, 16))
