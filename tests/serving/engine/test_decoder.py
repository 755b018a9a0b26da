"""The engine on tiny random models: greedy equality, self-drafting, cache bookkeeping,
stopping, provenance, detailed records, input validation and seeded sampling."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import PreTrainedModel

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.detailed import SCHEMA_VERSION
from serving.engine.drafters.base import Drafter, DraftProposal
from serving.engine.drafters.model import ModelDrafter
from serving.engine.drafters.ngram_store import NGramDrafter
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.kv import cache_length
from serving.engine.policy import MAX_DRAFT_TOKENS, AdaptiveK, FixedK
from serving.engine.request import CONTEXT_WINDOW
from serving.engine.sampling import SamplingParams, make_sampler
from serving.engine.step import speculative_step
from serving.errors import BadInputError
from serving.models.tiny import tiny_llama
from serving.models.truncated import first_layers
from serving.target import LoadedTarget

NEW_TOKENS = 48  # the length of conftest's greedy_reference
EOS = 2  # the tiny model's eos id; greedy_reference emits it at index 6


def model_drafter(model: PreTrainedModel) -> ModelDrafter:
    """A drafter of ``model`` taken as it is (the tiny target's kind of target)."""
    return ModelDrafter(LoadedTarget.of(model))


# Each takes the loaded tiny target (tests/serving/conftest.py's ``loaded``).
DRAFTERS = {
    "other_model": lambda loaded: model_drafter(tiny_llama(seed=1)),
    "first_layers": lambda loaded: ModelDrafter(loaded.over(first_layers(loaded.model, 2))),
    "prompt_lookup": lambda loaded: PromptLookupDrafter(),
    "ngram": lambda loaded: NGramDrafter(),
    "ngram_target_fallback": lambda loaded: NGramDrafter(n=3, fallback="target"),
}


def test_plain_decoding_matches_hugging_face(loaded, prompt, greedy_reference):
    result = SpeculativeDecoder(loaded).generate(prompt, max_new_tokens=NEW_TOKENS)
    assert result.token_ids == greedy_reference
    assert result.from_draft == [False] * NEW_TOKENS
    assert result.stats.checks == NEW_TOKENS and result.stats.acceptance_rate is None
    assert len(set(greedy_reference)) > 10  # the reference is not one repeated token


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("drafter_name", DRAFTERS)
def test_greedy_speculative_equals_plain_greedy(loaded, prompt, greedy_reference, drafter_name, k):
    drafter = DRAFTERS[drafter_name](loaded)
    result = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(k)).generate(
        prompt, max_new_tokens=NEW_TOKENS
    )
    assert result.token_ids == greedy_reference
    assert result.stats.draft_tokens > 0


@pytest.mark.parametrize("drafter_name", DRAFTERS)
def test_greedy_equality_with_adaptive_k(loaded, prompt, greedy_reference, drafter_name):
    drafter = DRAFTERS[drafter_name](loaded)
    decoder = SpeculativeDecoder(loaded, drafter=drafter, policy=AdaptiveK(2, k_max=6))
    assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == greedy_reference


def test_the_targets_guesses_fill_the_n_gram_drafts(loaded, prompt, greedy_reference):
    """Where the request's n-grams know nothing, the target's guesses from its last pass
    are drafted: more drafts and more accepted tokens than stopping, the same output."""
    results = {
        fallback: SpeculativeDecoder(
            loaded, drafter=NGramDrafter(n=3, fallback=fallback), policy=FixedK(4)
        ).generate(prompt, max_new_tokens=NEW_TOKENS)
        for fallback in ("stop", "target")
    }
    for result in results.values():
        assert result.token_ids == greedy_reference
    assert results["target"].stats.draft_tokens > results["stop"].stats.draft_tokens
    assert results["target"].stats.accepted_tokens >= results["stop"].stats.accepted_tokens


def test_single_token_prompt_needs_no_prefill(loaded):
    drafter = ModelDrafter(loaded.over(first_layers(loaded.model, 3)))
    plain = SpeculativeDecoder(loaded).generate([7], max_new_tokens=20)
    spec = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(3)).generate(
        [7], max_new_tokens=20
    )
    assert spec.token_ids == plain.token_ids


@pytest.mark.parametrize("k", [1, 4, 8])
def test_a_model_drafting_for_itself_accepts_every_draft(loaded, prompt, greedy_reference, k):
    drafter = model_drafter(tiny_llama())  # same seed: identical weights
    result = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(k)).generate(
        prompt, max_new_tokens=NEW_TOKENS
    )
    assert result.token_ids == greedy_reference
    assert result.stats.acceptance_rate == 1.0
    assert result.stats.accepted_tokens == result.stats.draft_tokens > 0
    if k > 1:
        assert result.stats.mean_accepted_length > 1.5


def test_target_cache_holds_all_but_the_last_token_after_every_step(
    loaded, prompt, greedy_reference
):
    drafter = PromptLookupDrafter(max_ngram=2)
    sampler = make_sampler()
    cache = loaded.new_cache()
    with torch.inference_mode():
        loaded(input_ids=torch.tensor([prompt[:-1]]), past_key_values=cache, use_cache=True)
    drafter.begin(list(prompt))
    tokens = list(prompt)
    rejected = accepted = 0
    while len(tokens) - len(prompt) < NEW_TOKENS:
        step = speculative_step(loaded, cache, tokens, drafter, 4, sampler)
        tokens += step.new_tokens
        assert cache_length(cache) == len(tokens) - 1
        rejected += step.accepted < step.proposed
        accepted += step.accepted
    assert rejected > 0 and accepted > 0
    assert tokens[len(prompt) : len(prompt) + NEW_TOKENS] == greedy_reference


@pytest.mark.parametrize(
    "make_decoder",
    [
        lambda loaded: SpeculativeDecoder(loaded, eos_token_ids=[EOS]),
        lambda loaded: SpeculativeDecoder(
            loaded, drafter=model_drafter(tiny_llama()), policy=FixedK(8), eos_token_ids=[EOS]
        ),
        lambda loaded: SpeculativeDecoder(
            loaded, drafter=PromptLookupDrafter(), policy=FixedK(4), eos_token_ids=[EOS, 95]
        ),
    ],
    ids=["plain", "self_draft", "prompt_lookup"],
)
def test_eos_stops_generation(loaded, prompt, greedy_reference, make_decoder):
    stop = greedy_reference.index(EOS)
    result = make_decoder(loaded).generate(prompt, max_new_tokens=NEW_TOKENS)
    assert result.token_ids == greedy_reference[: stop + 1]
    assert result.stop_reason == "eos"
    assert result.stats.generated_tokens == stop + 1


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 9, 17])
@pytest.mark.parametrize("k", [1, 8])
def test_max_new_tokens_is_respected_exactly(loaded, prompt, greedy_reference, max_new_tokens, k):
    drafter = model_drafter(tiny_llama())  # accepts everything, so blocks run into the budget
    result = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(k)).generate(
        prompt, max_new_tokens=max_new_tokens
    )
    assert result.token_ids == greedy_reference[:max_new_tokens]
    assert len(result.from_draft) == max_new_tokens
    assert result.stop_reason == "length"
    assert result.stats.generated_tokens == max_new_tokens


@pytest.mark.parametrize("drafter_name", ["first_layers", "prompt_lookup"])
def test_stream_provenance_matches_the_statistics(loaded, prompt, drafter_name):
    decoder = SpeculativeDecoder(loaded, drafter=DRAFTERS[drafter_name](loaded), policy=FixedK(4))
    generation = decoder.stream(prompt, max_new_tokens=NEW_TOKENS)
    events = list(generation)
    result = generation.result
    assert result is not None
    assert [e.token_id for e in events] == result.token_ids
    assert [e.from_draft for e in events] == result.from_draft
    assert sum(result.from_draft) == result.stats.accepted_tokens > 0
    assert [e.step for e in events] == sorted(e.step for e in events)
    assert events[-1].step == result.stats.checks - 1
    # Within a step the accepted drafts come first and the target's own token last.
    for step in range(result.stats.checks):
        flags = [e.from_draft for e in events if e.step == step]
        assert flags == [True] * (len(flags) - 1) + [False]


def check_record(result, prompt, drafter_kind: str):
    record = result.record
    assert record is not None
    data = json.loads(json.dumps(record.to_dict()))
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["output_token_ids"] == result.token_ids
    assert data["from_draft"] == result.from_draft
    assert data["accepted_tokens"] == result.stats.accepted_tokens
    assert data["drafter"]["kind"] == drafter_kind
    assert data["disagreements"], "expected rejections with this drafter"
    sequence = prompt + result.token_ids
    for d in data["disagreements"]:
        assert d["draft_token"] != d["target_token"]
        assert d["target_token"] == result.token_ids[d["position"]]
        before = sequence[: len(prompt) + d["position"]]
        assert d["context"] == before[-CONTEXT_WINDOW:]
        assert not result.from_draft[d["position"]]
        for key in ("target_prob_of_draft", "target_prob_of_target", "draft_prob_of_draft"):
            assert 0.0 <= d[key] <= 1.0


@pytest.mark.parametrize("drafter_name", ["first_layers", "ngram"])
def test_detailed_mode_records_disagreements(loaded, prompt, drafter_name):
    decoder = SpeculativeDecoder(loaded, drafter=DRAFTERS[drafter_name](loaded), policy=FixedK(4))
    result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, mode="detailed")
    kind = {"first_layers": "model", "ngram": "ngram_store"}[drafter_name]
    check_record(result, prompt, kind)
    assert decoder.generate(prompt, max_new_tokens=8).record is None  # fast mode: no record


def test_detailed_mode_under_sampling(loaded, prompt):
    decoder = SpeculativeDecoder(
        loaded, drafter=ModelDrafter(loaded.over(first_layers(loaded.model, 2))), policy=FixedK(3)
    )
    sampling = SamplingParams(temperature=0.8, seed=5)
    result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, sampling=sampling, mode="detailed")
    check_record(result, prompt, "model")
    assert result.record.sampling == {"temperature": 0.8, "top_k": 0, "top_p": 1.0, "seed": 5}


class ScriptedDrafter(Drafter):
    """Proposes a fixed continuation of the prompt, whatever the target said."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.prompt_len = 0

    def begin(self, prompt):
        self.prompt_len = len(prompt)

    def propose(self, request):
        generated = len(request.tokens) - self.prompt_len
        return DraftProposal(torch.tensor(self.script[generated : generated + request.k]))

    def commit(self, feedback):
        pass


def test_no_disagreement_is_recorded_past_an_accepted_eos(loaded, prompt, greedy_reference):
    # One block accepts the EOS draft and the draft after it, then is rejected: the output
    # stops at EOS, so that rejection is not a disagreement of this output.
    stop = greedy_reference.index(EOS)
    wrong = (greedy_reference[stop + 2] + 1) % 96
    script = [*greedy_reference[: stop + 2], wrong]
    decoder = SpeculativeDecoder(
        loaded, drafter=ScriptedDrafter(script), policy=FixedK(len(script)), eos_token_ids=[EOS]
    )
    result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, mode="detailed")
    assert result.token_ids == greedy_reference[: stop + 1]
    assert result.record is not None and result.record.disagreements == []


@pytest.mark.parametrize(
    ("prompt_tokens", "kwargs", "shown"),
    [
        ([], {}, "empty"),
        ([3, 96, 5], {}, "[96]"),
        ([3, -1], {}, "[-1]"),
        ([3] * 200, {"max_new_tokens": 57}, "max_new_tokens=57"),
        ([3], {"max_new_tokens": 0}, "got 0"),
        ([3], {"max_new_tokens": -4}, "got -4"),
        ([3], {"max_new_tokens": 2.5}, "2.5"),
        ([3], {"mode": "verbose"}, "'verbose'"),
    ],
)
def test_bad_requests_fail_before_any_model_work(loaded, monkeypatch, prompt_tokens, kwargs, shown):
    def forward(*args, **kw):
        raise AssertionError("the model ran before the request was validated")

    decoder = SpeculativeDecoder(loaded, drafter=PromptLookupDrafter(), policy=FixedK(2))
    monkeypatch.setattr(loaded.model, "forward", forward)
    with pytest.raises(BadInputError) as excinfo:
        decoder.stream(prompt_tokens, **kwargs)
    assert shown in str(excinfo.value)
    with pytest.raises(BadInputError):
        decoder.generate(prompt_tokens, **kwargs)


@pytest.mark.parametrize("k", [0, -1, MAX_DRAFT_TOKENS + 1, 10**6, 2.0, True])
def test_bad_draft_lengths_raise(k):
    with pytest.raises(BadInputError, match=re.escape(repr(k))):
        FixedK(k)
    with pytest.raises(BadInputError):
        AdaptiveK(k)


def test_a_drafter_needs_a_policy(loaded):
    with pytest.raises(BadInputError, match="policy"):
        SpeculativeDecoder(loaded, drafter=NGramDrafter())


@pytest.mark.parametrize("drafter_name", [None, "first_layers", "ngram", "ngram_target_fallback"])
def test_seeded_sampling_is_reproducible(loaded, prompt, drafter_name):
    def run(seed: int) -> list[int]:
        if drafter_name is None:
            decoder = SpeculativeDecoder(loaded)
        else:
            decoder = SpeculativeDecoder(
                loaded, drafter=DRAFTERS[drafter_name](loaded), policy=FixedK(3)
            )
        sampling = SamplingParams(temperature=1.0, top_p=0.95, seed=seed)
        return decoder.generate(prompt, max_new_tokens=32, sampling=sampling).token_ids

    first = run(123)
    assert run(123) == first
    assert run(124) != first
