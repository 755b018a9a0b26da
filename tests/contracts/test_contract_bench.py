"""The token ids ``specops bench --prompts 2 --max-new-tokens 64 --threads 2`` generates
with the shipped SmolLM2-135M (tests/fixtures/contracts/bench-token-ids.json): the bench
still runs the stored methods on the stored settings, every row still equals its
reference, and (real model, minutes) a bench run today generates the same token ids."""

from __future__ import annotations

import pytest

from tasks.bench.bench import load_bench_config


@pytest.fixture(scope="module")
def stored(gen, fixtures):
    return gen.read_json(fixtures / "bench-token-ids.json")


def test_the_bench_config_still_names_the_stored_methods(gen, stored):
    config = load_bench_config(**gen.BENCH_SETTINGS)  # what the command overrides
    assert gen.bench_config(config.model_dump(mode="json")) == stored["config"]


def test_every_stored_row_equals_its_reference(stored):
    token_ids = stored["token_ids"]
    assert set(token_ids) == set(stored["references"])
    for method, reference in stored["references"].items():
        assert set(token_ids[method]) == set(stored["prompts"]), method
        if reference is not None:
            assert token_ids[method] == token_ids[reference], method
        assert all(stored["identical"][method].values()), method


@pytest.mark.benchmark  # not in the test command: run it with -m benchmark
@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.timeout(3600)  # ~10 min on two idle cores; far longer on a busy machine
def test_the_bench_generates_the_same_token_ids(gen, stored, tmp_path):
    generated = gen.bench_token_ids(gen.read_json(gen.run_bench(tmp_path)))
    assert generated["token_ids"] == stored["token_ids"]
    assert generated == stored
