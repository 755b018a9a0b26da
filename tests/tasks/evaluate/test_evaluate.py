import time

import pytest

import tasks.evaluate.evaluate as evaluate_module
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.package import DraftManifest, write_package
from serving.errors import BadInputError
from serving.models.tiny import tiny_llama
from serving.records.schema import RequestRecord, parse_record
from serving.target import LoadedTarget
from tasks.evaluate.evaluate import (
    REFERENCE,
    Contender,
    EncodedPrompt,
    evaluate,
    traffic_prompts,
)
from tests.tasks.data.test_validate import make_record


@pytest.fixture
def contenders(tmp_path):
    return [
        Contender("champion", write_package(tmp_path / "a", DraftManifest(drafter="pld:3", k=4))),
        Contender(
            "challenger", write_package(tmp_path / "b", DraftManifest(drafter="ngram:3", k=4))
        ),
    ]


def test_every_contender_is_lossless_and_measured(evaluation_target, make_prompts, contenders):
    prompts = make_prompts()
    report = evaluate(
        contenders, prompts, target=evaluation_target,
        max_new_tokens=16, progress=False,
    )  # fmt: skip
    assert report["prompts"] == len(prompts)
    assert set(report["results"]) == {REFERENCE, "champion", "challenger"}
    for name, result in report["results"].items():
        assert result["lossless"], name
        assert result["requests"] == len(prompts)
        assert result["tokens_per_s"] > 0 and result["speedup"] > 0
    assert report["results"][REFERENCE]["draft_tokens"] == 0
    assert report["results"]["champion"]["draft_tokens"] > 0
    assert report["results"]["champion"]["mean_accepted_length"] >= 1.0
    assert set(report["by_workload"]) == {"grounded"}
    # The JSON the commands write keeps its keys, in their order.
    assert list(report) == [
        "hardware", "prompts", "max_new_tokens", "contenders", "results", "by_workload",
        "by_source", "per_prompt", "rounds", "verify_curve", "draft_costs",
        "evaluated_curve", "evaluated_passes", "predicted_speedups", "untimed",
        "stopped_early", "phase_s",
    ]  # fmt: skip
    assert set(report["phase_s"]) == {"profile", "timed"}  # no pre-gate asked for
    # Two timed rounds by default, each prompt's seconds their mean; the drafting cost of
    # both drafters profiled first, in one-token passes (n-gram lookups cost next to nothing).
    assert report["rounds"] == 2
    for run in report["per_prompt"]["champion"]:
        assert len(run["round_seconds"]) == 2
        assert run["seconds"] == pytest.approx(sum(run["round_seconds"]) / 2)
    assert set(report["draft_costs"]) == {"champion", "challenger"}
    assert all(0 <= cost < 1 for cost in report["draft_costs"].values())
    assert report["verify_curve"][0] == 1.0
    # The curve the timed passes followed: plain decoding alone verified 16 one-token
    # blocks a prompt in each round; every size it prices has its count of passes.
    assert report["evaluated_curve"][0] == 1.0
    assert report["evaluated_passes"][0] >= 2 * 16 * len(prompts)
    assert len(report["evaluated_passes"]) == len(report["evaluated_curve"])
    assert list(report["results"]["champion"]) == [
        "requests", "generated_tokens", "checks", "draft_tokens", "accepted_tokens",
        "acceptance_rate", "mean_accepted_length", "total_s", "tokens_per_s", "speedup",
        "acceptance_by_position", "lossless", "mismatched_prompts",
    ]  # fmt: skip
    assert list(report["per_prompt"]["champion"][0]) == [
        "prompt_id", "workload", "seconds", "stats", "steps", "lossless", "round_seconds",
    ]  # fmt: skip


def test_an_output_that_differs_from_plain_decoding_is_caught(
    monkeypatch, evaluation_target, make_prompts, contenders
):
    build = evaluate_module._decoders

    def with_a_wrong_challenger(*args):
        runs = build(*args)
        other = tiny_llama(seed=7)  # another model: its greedy output differs
        runs[-1].decoder = SpeculativeDecoder(LoadedTarget.of(other), eos_token_ids=[2])
        return runs

    monkeypatch.setattr(evaluate_module, "_decoders", with_a_wrong_challenger)
    report = evaluate(
        contenders, make_prompts(), target=evaluation_target,
        max_new_tokens=12, progress=False,
    )  # fmt: skip
    assert report["results"]["champion"]["lossless"]
    assert not report["results"]["challenger"]["lossless"]
    assert report["results"]["challenger"]["mismatched_prompts"]


def test_a_challenger_the_first_round_shows_slower_is_timed_no_more(
    monkeypatch, evaluation_target, make_prompts, contenders
):
    """With a stopping confidence, a challenger whose first round puts its wall-clock
    interval wholly below the champion's runs no second round; the champion does."""
    build = evaluate_module._decoders

    def with_a_slow_challenger(*args):
        runs = build(*args)
        decoder = runs[-1].decoder
        generate = decoder.generate

        def slow(*a, **k):
            time.sleep(0.5)  # far slower than the tiny target decodes 12 tokens
            return generate(*a, **k)

        monkeypatch.setattr(decoder, "generate", slow)
        return runs

    monkeypatch.setattr(evaluate_module, "_decoders", with_a_slow_challenger)
    prompts = make_prompts()
    report = evaluate(
        contenders, prompts, target=evaluation_target,
        max_new_tokens=12, rounds=3, stop_confidence=0.95, progress=False,
    )  # fmt: skip
    assert list(report["stopped_early"]) == ["challenger"]
    assert "after one round" in report["stopped_early"]["challenger"]
    assert all(len(run["round_seconds"]) == 1 for run in report["per_prompt"]["challenger"])
    assert all(len(run["round_seconds"]) == 3 for run in report["per_prompt"]["champion"])
    assert report["results"]["challenger"]["lossless"]


def test_bad_evaluations_fail_clearly(evaluation_target, make_prompts, contenders):
    with pytest.raises(BadInputError, match="held-out split is empty"):
        evaluate(contenders, [], target=evaluation_target)
    with pytest.raises(BadInputError, match="at least one contender"):
        evaluate([], make_prompts(), target=evaluation_target)
    twice = [contenders[0], contenders[0]]
    with pytest.raises(BadInputError, match="must be unique"):
        evaluate(twice, make_prompts(), target=evaluation_target)


def record(rid: str, workload: str, timestamp: float, ids: list[int]) -> RequestRecord:
    return parse_record(
        make_record(0, id=rid, workload=workload, timestamp=timestamp, prompt_token_ids=ids)
    )


def test_traffic_prompts_take_the_newest_per_workload_once_each():
    records = [
        record("a", "humaneval", 1.0, [5, 6]),
        record("b", "humaneval", 3.0, [7, 8]),
        record("c", "humaneval", 2.0, [7, 8]),  # the same request again: evaluated once
        record("d", "grounded", 1.0, [9]),
        record("e", "live", 4.0, []),  # nothing to replay
    ]
    prompts = traffic_prompts(records, per_workload=1)
    assert [(p.id, p.workload) for p in prompts] == [
        ("d", "traffic:grounded"),
        ("b", "traffic:humaneval"),
    ]
    assert [p.id for p in traffic_prompts(records)] == ["d", "a", "b"]  # by workload, id
    with pytest.raises(BadInputError, match="per_workload"):
        traffic_prompts(records, per_workload=0)


def test_held_out_traffic_and_built_in_prompts_are_reported_apart(
    evaluation_target, char_tokenizer, make_prompts, contenders
):
    builtin = make_prompts()
    traffic = [
        EncodedPrompt(
            "t1", "traffic:humaneval", char_tokenizer("replayed request one")["input_ids"]
        ),
        EncodedPrompt(
            "t2", "traffic:humaneval", char_tokenizer("replayed request two")["input_ids"]
        ),
    ]
    report = evaluate(
        contenders, [*builtin, *traffic], target=evaluation_target,
        max_new_tokens=12, progress=False,
    )  # fmt: skip
    assert set(report["by_source"]) == {"builtin", "traffic"}
    assert report["by_source"]["traffic"]["champion"]["requests"] == 2
    assert report["by_source"]["builtin"]["champion"]["requests"] == len(builtin)
    assert "traffic:humaneval" in report["by_workload"]
    assert all(r["lossless"] for r in report["results"].values())
    with pytest.raises(BadInputError, match="without tokens"):
        evaluate(
            contenders, [EncodedPrompt("x", "traffic:live", [])], target=evaluation_target,
        )  # fmt: skip
