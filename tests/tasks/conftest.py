"""Fixtures for the failure-case data tests: a prompt-lookup decoder over the tiny target
(the character tokenizer and text prompts live in tests/conftest.py), so that collection
runs the real engine in a second."""

from __future__ import annotations

import pytest

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.target import LoadedTarget


@pytest.fixture
def pld_decoder(target) -> SpeculativeDecoder:
    return SpeculativeDecoder(
        LoadedTarget.of(target, eos_token_ids=[2]), drafter=PromptLookupDrafter(), policy=FixedK(4)
    )


@pytest.fixture(scope="module")
def lean_int4() -> LoadedTarget:
    """The ``target`` fixture's model (``tiny_llama()``'s weights) on the lean int4 step."""
    from tests.serving.lean.models import tiny_target

    return tiny_target("int4", hidden_size=32, intermediate_size=64, num_layers=4)
