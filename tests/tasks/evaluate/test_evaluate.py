import pytest

import tasks.evaluate.evaluate as evaluate_module
from serving.drafters.package import DraftManifest, write_package
from serving.engine import SpeculativeDecoder
from serving.errors import BadInputError
from serving.models.tiny import tiny_llama
from tasks.evaluate.evaluate import REFERENCE, Contender, evaluate


@pytest.fixture
def contenders(tmp_path):
    return [
        Contender("champion", write_package(tmp_path / "a", DraftManifest(drafter="pld:3", k=4))),
        Contender(
            "challenger", write_package(tmp_path / "b", DraftManifest(drafter="ngram:3", k=4))
        ),
    ]


def test_every_contender_is_lossless_and_measured(target, char_tokenizer, make_prompts, contenders):
    prompts = make_prompts()
    report = evaluate(
        contenders, prompts, target=target, tokenizer=char_tokenizer, hardware="cpu",
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


def test_an_output_that_differs_from_plain_decoding_is_caught(
    monkeypatch, target, char_tokenizer, make_prompts, contenders
):
    build = evaluate_module._decoders

    def with_a_wrong_challenger(*args):
        runs = build(*args)
        other = tiny_llama(seed=7)  # another model: its greedy output differs
        runs[-1].decoder = SpeculativeDecoder(other, eos_token_ids=[2])
        return runs

    monkeypatch.setattr(evaluate_module, "_decoders", with_a_wrong_challenger)
    report = evaluate(
        contenders, make_prompts(), target=target, tokenizer=char_tokenizer, hardware="cpu",
        max_new_tokens=12, progress=False,
    )  # fmt: skip
    assert report["results"]["champion"]["lossless"]
    assert not report["results"]["challenger"]["lossless"]
    assert report["results"]["challenger"]["mismatched_prompts"]


def test_bad_evaluations_fail_clearly(target, char_tokenizer, make_prompts, contenders):
    with pytest.raises(BadInputError, match="held-out split is empty"):
        evaluate(contenders, [], target=target, tokenizer=char_tokenizer, hardware="cpu")
    with pytest.raises(BadInputError, match="at least one contender"):
        evaluate([], make_prompts(), target=target, tokenizer=char_tokenizer, hardware="cpu")
    twice = [contenders[0], contenders[0]]
    with pytest.raises(BadInputError, match="must be unique"):
        evaluate(twice, make_prompts(), target=target, tokenizer=char_tokenizer, hardware="cpu")
