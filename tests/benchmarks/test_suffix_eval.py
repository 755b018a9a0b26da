"""The suffix evaluation's model-free replay agrees with the engine, and its summary pools."""

from __future__ import annotations

import pytest

from benchmarks.suffix_eval import BASELINE, _summary, replay_greedy
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.drafters.suffix import SuffixDrafter, SuffixIndex
from serving.engine.policy import FixedK
from serving.target import LoadedTarget


def corpus_of(*sequences: list[int]) -> SuffixIndex:
    index = SuffixIndex()
    for sequence in sequences:
        index.add_sequence(sequence)
    return index


@pytest.mark.parametrize("k", [1, 4])
def test_replay_counts_what_the_engine_counts(target, prompt, greedy_reference, k):
    drafters = [
        PromptLookupDrafter(),
        SuffixDrafter(),
        SuffixDrafter(corpus_of(greedy_reference[3:20], greedy_reference[30:])),
    ]
    for drafter in drafters:
        decoder = SpeculativeDecoder(LoadedTarget.of(target), drafter=drafter, policy=FixedK(k))
        stats = decoder.generate(prompt, max_new_tokens=len(greedy_reference)).stats
        replay = replay_greedy(drafter, prompt, greedy_reference, k)
        assert (replay.checks, replay.draft_tokens, replay.accepted_tokens) == (
            stats.checks,
            stats.draft_tokens,
            stats.accepted_tokens,
        )
        assert replay.mean_accepted_length == pytest.approx(stats.mean_accepted_length)


def test_summary_pools_counts_and_compares_rates_with_the_baseline():
    def run(method, tokens, seconds, checks, drafted, accepted, identical=True):
        stats = {
            "prompt_tokens": 5,
            "generated_tokens": tokens,
            "checks": checks,
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": tokens / checks,
            "acceptance_by_position": [],
            "prefill_s": 0.0,
            "draft_s": 0.01,
            "verify_s": seconds,
            "total_s": seconds,
            "tokens_per_s": tokens / seconds,
        }
        return {
            "method": method,
            "tokens": tokens,
            "seconds": seconds,
            "identical": identical,
            "stats": stats,
        }

    runs = [
        run(BASELINE, 10, 2.0, 10, 0, 0),
        run(BASELINE, 10, 3.0, 10, 0, 0),
        run("suffix", 10, 1.0, 5, 8, 5),
        run("suffix", 10, 1.5, 4, 8, 6, identical=False),
    ]
    base, suffix = _summary(runs, [BASELINE, "suffix"])
    assert base["speedup"] == 1.0 and base["acceptance_rate"] is None
    assert suffix["tokens_per_s"] == pytest.approx(20 / 2.5)
    assert suffix["speedup"] == pytest.approx((20 / 2.5) / (20 / 5.0))
    assert suffix["acceptance_rate"] == pytest.approx(11 / 16)
    assert suffix["mean_accepted_length"] == pytest.approx(20 / 9)
    assert suffix["identical"] is False
