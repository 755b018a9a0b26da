"""Reading teacher caches: a missing or corrupt cache is reported, naming what to do.

What a cache holds, read back, is checked against the tiny target in test_teacher_build.py."""

from __future__ import annotations

import pytest

from serving.errors import BadInputError
from tasks.train.teacher import MANIFEST, load_teacher_data


def test_a_missing_cache_is_reported(tmp_path):
    with pytest.raises(BadInputError, match="no teacher cache at"):
        load_teacher_data(tmp_path / "nothing")


def test_a_corrupt_manifest_is_reported(tmp_path):
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(BadInputError, match=r"manifest\.json is corrupt"):
        load_teacher_data(tmp_path)
