"""The tiny target as the loop loads a target: a :class:`~serving.target.LoadedTarget` over
tests/conftest.py's model and character tokenizer, on a hardware target (its verify curve
prices the policies), ending at the model's and the tokenizer's end-of-sequence ids."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from serving.hardware import HardwareTarget
from serving.target import LoadedTarget, eos_ids


@pytest.fixture
def loaded_on(target, char_tokenizer) -> Callable[[HardwareTarget], LoadedTarget]:
    """``hardware`` -> the tiny target loaded for it (its model on the CPU, as it is)."""

    def load(hardware: HardwareTarget) -> LoadedTarget:
        return LoadedTarget.of(
            target,
            char_tokenizer,
            hardware=hardware,
            eos_token_ids=eos_ids(target, char_tokenizer),
        )

    return load
