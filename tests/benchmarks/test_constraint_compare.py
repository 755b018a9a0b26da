"""The constraint-library comparison: its checks, and a real run of the library the
product chose (llguidance, the only one installed) on the shipped tokenizer."""

from __future__ import annotations

import pytest
import torch

from benchmarks.constraint_compare import (
    INVALID_SKELETONS,
    VALID_SKELETONS,
    compare_constraints,
    format_table,
    measure_library,
)


def test_an_unknown_library_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown libraries \['guidance-9'\]"):
        compare_constraints(("llguidance", "guidance-9"))


def test_the_table_shows_a_failed_library_with_its_reason():
    report = {"libraries": {"xgrammar": {"installed": False, "error": "cannot import xgrammar"}}}
    assert "| xgrammar | | | | | | | | | cannot import xgrammar |" in format_table(report)


@pytest.fixture
def threads_kept():
    """measure_library sets one torch thread (it expects a process of its own): restored."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.real_model
def test_llguidance_passes_every_check_on_the_real_tokenizer(threads_kept):
    # In this process, not a spawned one as the study does: the checks are the same, and
    # a fresh interpreter importing transformers again would cost most of the test.
    row = measure_library("llguidance", random_walks=2)
    assert row["correct"], row["problems"]
    assert row["checks"] == {
        "valid": f"{len(VALID_SKELETONS)}/{len(VALID_SKELETONS)}",
        "invalid": f"{len(INVALID_SKELETONS)}/{len(INVALID_SKELETONS)}",
        "eos": True,
        "extra_ids": True,
        "random_walks": "2/2",
    }
    assert row["steps_timed"] > 0 and row["mask_us"] > 0
    report = {"libraries": {"llguidance": row}}
    assert "| llguidance | " in format_table(report) and "| yes |" in format_table(report)
