"""The tiny target as the evaluation loads a target: a
:class:`~serving.target.LoadedTarget` with the character tokenizer, on hardware target
``cpu`` (its verify curve prices the policies, its name is the report's), stopping at
the model's end-of-sequence ids."""

from __future__ import annotations

import pytest

from serving.hardware import engine_target
from serving.target import LoadedTarget, eos_ids


@pytest.fixture(scope="session")
def evaluation_target(target, char_tokenizer) -> LoadedTarget:
    """``target`` (its layers as they are) with ``char_tokenizer``, on ``cpu``."""
    return LoadedTarget.of(
        target,
        char_tokenizer,
        hardware=engine_target("cpu"),
        eos_token_ids=eos_ids(target, char_tokenizer),
    )
