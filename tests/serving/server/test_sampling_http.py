"""Sampling over HTTP (temperature, top_k, top_p, seed) on the tiny target: a seed
reproduces its tokens and another seed does not; top_k=1 and a tiny top_p are greedy; bad
values are 400s naming the field; with a drafter on, the answer is the engine's own
sampled output for that seed (the server adds nothing to the draws)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from serving.engine.build import build_decoder
from serving.engine.drafters.plan import DraftPlan
from serving.engine.sampling import SamplingParams

PROMPT = "abc abc abc abc"
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# Under sampling the tokens a seed draws depend on the draft lengths (each verified draft
# takes a uniform); the cost-aware default picks them from timings and, in a batch, from
# the other requests. A fixed k makes a seed reproducible (docs/serving.md).
FIXED = {"draft_policy": "fixed", "num_speculative_tokens": 4}


def complete(client, **fields) -> dict:
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 16, **fields}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def text(answer: dict) -> str:
    return answer["choices"][0]["text"]


def batch_passes(client) -> tuple[float, float]:
    """Packed target passes so far, and the requests they carried."""
    metrics = client.get("/metrics").text

    def value(name: str) -> float:
        found = re.search(rf"^specops:batch_size_{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", metrics, re.M)
        assert found, name
        return float(found.group(1))

    return value("count"), value("sum")


def test_the_same_seed_gives_the_same_tokens_twice(tiny_client):
    first = complete(tiny_client, **SAMPLED, **FIXED, seed=11)
    second = complete(tiny_client, **SAMPLED, **FIXED, seed=11)
    assert text(first) == text(second)
    assert first["usage"] == second["usage"]
    assert first["usage"]["completion_tokens"] == 16


def test_different_seeds_differ_and_differ_from_greedy(tiny_client):
    """Over the tiny target's 49k-token vocabulary at temperature 1, two seeds agreeing on
    sixteen draws would take a near-degenerate distribution; the greedy answer shows it is
    not one."""
    greedy = text(complete(tiny_client, temperature=0))
    sampled = [text(complete(tiny_client, temperature=1.0, seed=seed)) for seed in range(4)]
    assert len(set(sampled)) == 4, sampled
    assert greedy not in sampled


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 1.0, "top_k": 1, "seed": 3},
        {"temperature": 1.5, "top_k": 1},  # no seed: any draw from one token is that token
        {"temperature": 1.0, "top_p": 1e-6, "seed": 3},  # the top token's mass is enough
        {"temperature": 0, "top_k": 40, "top_p": 0.5, "seed": 9},  # greedy ignores them
    ],
)
def test_a_single_candidate_is_greedy(tiny_client, fields):
    assert text(complete(tiny_client, **fields)) == text(complete(tiny_client, temperature=0))


def test_top_k_minus_one_disables_top_k_as_zero_does(tiny_client):
    """vLLM's -1 and OpenAI-style 0 both mean no top-k: the same seed, the same draws."""
    off = complete(tiny_client, temperature=1.0, top_k=0, seed=5, **FIXED)
    minus_one = complete(tiny_client, temperature=1.0, top_k=-1, seed=5, **FIXED)
    assert text(off) == text(minus_one)
    narrowed = complete(tiny_client, temperature=1.0, top_k=2, seed=5, **FIXED)
    assert text(narrowed) != text(off)  # and top_k itself reaches the sampler


def test_a_seeded_stream_equals_the_seeded_answer(tiny_client):
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 16, **SAMPLED, **FIXED, "seed": 21}
    with tiny_client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    streamed = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines)
    assert streamed == text(complete(tiny_client, **SAMPLED, **FIXED, seed=21))


@pytest.mark.parametrize("drafter", ["none", "layers:1"])
def test_concurrent_seeded_requests_draw_as_if_alone(tiny_client, drafter):
    """Requests batched into the same passes each keep their own generator (with a fixed
    k: the cost-aware policy plans a batch's draft lengths together)."""

    def sampled(seed: int) -> str:
        return text(complete(tiny_client, **SAMPLED, **FIXED, seed=seed, drafter=drafter))

    seeds = (1, 2, 3)
    alone = [sampled(seed) for seed in seeds]
    passes, rows = batch_passes(tiny_client)
    with ThreadPoolExecutor(len(seeds)) as pool:
        together = list(pool.map(sampled, seeds))
    more_passes, more_rows = batch_passes(tiny_client)
    assert together == alone
    assert (more_rows - rows) / (more_passes - passes) > 1  # they did share passes


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("temperature", 2.5),
        ("temperature", "hot"),
        ("top_p", 0),
        ("top_p", -0.1),
        ("top_p", 1.5),
        ("top_k", -2),
        ("top_k", 1.5),
        ("seed", "lucky"),
    ],
)
def test_bad_sampling_values_are_400s_naming_the_field(tiny_client, field, value):
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 4, field: value}
    response = tiny_client.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{field}: ")


@pytest.mark.parametrize("drafter", ["pld", "ngram:2", "layers:1"])
def test_sampling_with_a_drafter_equals_the_engines_own_draws(tiny_client, tiny_state, drafter):
    """The server's answer, token counts and speculation statistics are those of the engine
    run directly with the same drafter, policy and seed."""
    state = tiny_state
    answer = complete(
        tiny_client, **SAMPLED, seed=3, drafter=drafter, draft_policy="fixed",
        num_speculative_tokens=4,
    )  # fmt: skip
    prompt_ids = list(state.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    decoder = build_decoder(
        state.target,
        DraftPlan.parse(drafter, policy="fixed", k=4),
        eos_token_ids=state.target.eos_token_ids,
        max_context=state.max_context,
    )
    want = decoder.generate(
        prompt_ids, max_new_tokens=16, sampling=SamplingParams(**SAMPLED, seed=3)
    )
    assert text(answer) == state.tokenizer.decode(want.token_ids, skip_special_tokens=True)
    usage = answer["usage"]
    assert usage["completion_tokens"] == len(want.token_ids)
    speculative = usage["speculative"]
    assert speculative["draft_version"] == drafter
    assert speculative["draft_tokens"] == want.stats.draft_tokens > 0  # the drafter was on
    assert speculative["accepted_tokens"] == want.stats.accepted_tokens
    assert speculative["checks"] == want.stats.checks
