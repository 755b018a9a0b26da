"""The base head's corpus leaves out every training prompt the product draws."""

from __future__ import annotations

import pytest

from serving.errors import BadInputError
from tasks.data.traffic import build_workload
from tasks.train.base_corpus import corpus_prompts, reserved_sources, source_of


def test_a_prompt_names_its_source():
    assert source_of("sharegpt:abc_0:0") == "sharegpt:abc_0:0"
    assert source_of("grounded-summarise:sharegpt:abc_0:0") == "sharegpt:abc_0:0"
    assert source_of("humaneval:HumanEval/3") == "humaneval:HumanEval/3"


def test_every_smaller_draw_of_a_reserved_seed_is_reserved():
    reserved = reserved_sources(40, [0, 7])
    for seed in (0, 7):
        for workload in ("sharegpt", "grounded"):
            drawn = build_workload(workload, 25, seed=seed, split="train")
            assert {source_of(p.id) for p in drawn} <= reserved, (workload, seed)
            assert corpus_prompts(drawn, reserved) == []
    other = build_workload("sharegpt", 200, seed=3, split="train")
    kept = corpus_prompts(other, reserved)
    assert kept and len(kept) < len(other)  # another seed's draw is only partly reserved
    assert all(source_of(p.id) not in reserved for p in kept)


def test_no_reserve_reserves_nothing_and_a_negative_one_is_refused():
    assert reserved_sources(0, [0]) == set()
    with pytest.raises(BadInputError, match="reserve must be >= 0, got -1"):
        reserved_sources(-1, [0])
