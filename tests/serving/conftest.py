"""The tiny target (tests/conftest.py's ``target``) as the engine takes it: a
:class:`~serving.target.LoadedTarget` over the same model, taken as it is (no kernels, no
lean step, no end-of-sequence ids: decoding runs to its token budget)."""

from __future__ import annotations

import pytest
from transformers import PreTrainedModel

from serving.target import LoadedTarget


@pytest.fixture(scope="session")
def loaded(target: PreTrainedModel) -> LoadedTarget:
    """``target`` wrapped as it is (:meth:`LoadedTarget.of`)."""
    return LoadedTarget.of(target)
