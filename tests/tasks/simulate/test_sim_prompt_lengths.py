"""Distributed bench results written before the bench recorded prompt lengths get them
back from their own settings: the same seeded workload, encoded the same way."""

from __future__ import annotations

import copy

from serving.loader import encode_prompt
from tasks.data.traffic import build_workload
from tasks.simulate.prompt_lengths import fill_prompt_lengths


def _measured(**request) -> dict:
    settings = {"requests": 2, "sessions": [1, 2], "workload": "grounded", "seed": 3}
    points = [{"per_request": [{"prompt": 0, **request}, {"prompt": 5}]}, {"per_request": []}]
    return {"settings": settings, "points": points}


def test_missing_lengths_are_rebuilt_from_the_settings(char_tokenizer):
    measured = _measured()
    fill_prompt_lengths(measured, tokenizer=char_tokenizer)
    # the bench built max(requests, 2 x sessions) = 4 prompts; request 5 reused prompt 1
    prompts = build_workload("grounded", 4, seed=3)
    lengths = [len(encode_prompt(char_tokenizer, p.user_text)) for p in prompts]
    first, second = measured["points"][0]["per_request"]
    assert (first["prompt_tokens"], second["prompt_tokens"]) == (lengths[0], lengths[1])
    assert lengths[0] != lengths[1]  # so the assertion above checks the index


def test_results_with_every_length_are_left_alone():
    measured = _measured(prompt_tokens=7)
    measured["points"][0]["per_request"][1]["prompt_tokens"] = 9
    before = copy.deepcopy(measured)
    fill_prompt_lengths(measured, tokenizer=None)  # would load a tokenizer if it needed one
    assert measured == before
