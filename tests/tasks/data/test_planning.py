"""The planning workload: held-out ShareGPT questions that ask for a plan
(tasks/data/planning.py)."""

from __future__ import annotations

import pytest

from serving.errors import BadInputError
from tasks.data.planning import is_planning_request, planning_available, planning_prompts
from tasks.data.prompts import split_of


@pytest.mark.parametrize(
    "text",
    [
        "Plan a 1 week trip to the bay area",
        "What are the steps to open a bakery in my town?",
        "Give me some TIPS for running a hackathon at work",
        "Write an outline for an essay about remote work",
        "How to start a vegetable garden on a balcony?",
        "How can I learn to play the guitar as an adult?",
        "what are 5 reasons to learn a second language",
        "Make me a checklist for moving to a new apartment",
    ],
)
def test_the_rule_matches_requests_for_a_plan(text):
    assert is_planning_request(text)


@pytest.mark.parametrize(
    "text",
    [
        "What is the capital of Australia and why was it chosen?",  # no keyword
        "Translate this sentence into French: good morning to all",
        "continue to step 2",  # fewer than 5 words
        "How to fix this?\n```python\nprint(x)\n```",  # code fence
        "how to make this compile: int main() { return 0 }",  # braces
        "How to make a cake for my son's birthday party? " * 20,  # over 600 characters
        "My ship's planks are rotting; what wood should replace them",  # "plan" inside a word
    ],
)
def test_the_rule_refuses_other_requests(text):
    assert not is_planning_request(text)


def test_prompts_are_held_out_planning_requests_in_seeded_order(pairs):
    prompts = planning_prompts(20, seed=0)
    assert prompts == planning_prompts(20, seed=0)  # deterministic
    assert planning_prompts(10, seed=0) == prompts[:10]  # a larger n extends a smaller one
    assert planning_prompts(20, seed=1) != prompts
    assert len({p.id for p in prompts}) == 20
    for prompt in prompts:
        assert prompt.split == "heldout" and split_of(prompt.id) == "heldout"
        assert prompt.workload == "sharegpt" and prompt.reference
        assert is_planning_request(prompt.user_text)


def test_asking_for_more_than_the_split_holds_is_an_error(pairs):
    available = planning_available()
    assert 100 < available < len(pairs)
    with pytest.raises(BadInputError, match=f"has only {available}"):
        planning_prompts(available + 1)
    with pytest.raises(BadInputError, match="positive integer"):
        planning_prompts(0)
