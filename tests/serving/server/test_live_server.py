"""A real `specops serve` process on loopback, driven by the official openai client:
streaming and non-streaming, greedy output equal to the engine's, metrics that move, a
hot swap under load, 429 from a full queue, cancellation on disconnect, capture."""

import asyncio
import json
import re
import time

import httpx
import openai
import pytest
import yaml

from serving.engine.build import build_decoder
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.drafters.suffix import SuffixCorpus
from serving.loader import encode_messages
from serving.records import store
from serving.server.config import SERVING_CONFIG
from tasks.data.validate import validate_store
from tasks.ops.loadtest import LoadTestSettings, run_load_test
from tasks.ops.server_process import ServerProcess
from tasks.train.suffix_index import save_suffix_index

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Rewrite with correct grammar: 'the team have expected the opposite for many month'",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three uses of a paperclip.",
    "Summarise in one sentence: the cat sat on the mat because the mat was warm.",
]


def point(pointer, package, version):
    pointer.write_text(json.dumps({"package": str(package), "version": version}))


@pytest.fixture(scope="module")
def champion(tmp_path_factory, real_packed):
    """A prompt-lookup package, and an n-gram package carrying a shared store (built from
    the prompts' tokens) to swap to."""
    root = tmp_path_factory.mktemp("champion")
    tokenizer = real_packed.tokenizer
    corpus = root / "store.json"
    sequences = tuple(tuple(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS)
    save_suffix_index(SuffixCorpus(sequences, {}), corpus)
    shared = DraftManifest(drafter="ngram:4,fallback=shared,store=store.json", k=6)
    packages = {
        "pld": write_package(root / "pld", DraftManifest(drafter="pld:3", k=8)),
        "ngram": write_package(root / "ngram", shared, files={"store.json": corpus}),
    }
    pointer = root / "champion.json"
    point(pointer, packages["pld"], "1")
    return pointer, packages


# The champion is polled every half second (the shipped config: 5 s), so that a promotion
# lands while the hot-swap test's requests are still decoding.
CHAMPION_POLL_S = 0.5


@pytest.fixture(scope="module")
def server(champion, tmp_path_factory):
    pointer, _ = champion
    logs = tmp_path_factory.mktemp("logs")
    config = yaml.safe_load(SERVING_CONFIG.read_text())
    config["champion"]["poll_s"] = CHAMPION_POLL_S
    config_path = logs / "serving.yaml"
    config_path.write_text(yaml.safe_dump(config))
    args = ["--config", str(config_path), "--champion", str(pointer), "--threads", "2"]
    with ServerProcess(args, log_path=logs / "server.log") as process:
        yield process


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def references(real_packed):
    """Plain greedy (no draft) through the engine: what every drafter must reproduce."""
    tokenizer = real_packed.tokenizer
    plain = build_decoder(real_packed)  # stops at the target's end-of-sequence ids
    out = {}
    for prompt in PROMPTS:
        ids = encode_messages(tokenizer, [{"role": "user", "content": prompt}])
        result = plain.generate(ids, max_new_tokens=24)
        out[prompt] = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    return out


def metric(text: str, name: str) -> float:
    total = 0.0
    for match in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M):
        total += float(match.group(1))
    return total


def ask(client, prompt, **fields):
    return client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": prompt}],
        **{"max_tokens": 24, "temperature": 0, **fields},
    )


def test_non_streaming_greedy_equals_the_engine(client, references):
    for prompt in PROMPTS[:2]:
        response = ask(client, prompt)
        assert response.choices[0].message.content == references[prompt]
        assert response.usage.completion_tokens <= 24
        assert response.usage.model_extra["speculative"]["draft_version"] == "1"


def test_streaming_greedy_equals_the_engine(client, references):
    stream = ask(client, PROMPTS[1], stream=True, stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(pieces) == references[PROMPTS[1]]
    assert usage is not None and usage.completion_tokens > 0


def test_four_concurrent_streams_are_batched_and_equal_the_engine(server, references):
    """Four streams at once through the async openai client: they share packed passes
    (the batch-size histogram moves past 1) and each equals its one-at-a-time output."""

    async def stream(client, prompt: str) -> str:
        chunks = await client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=24,
            temperature=0,
            stream=True,
        )
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

    async def all_four() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        try:
            return await asyncio.gather(*(stream(client, p) for p in PROMPTS))
        finally:
            await client.close()

    before = httpx.get(f"{server.url}/metrics").text
    texts = asyncio.run(all_four())
    after = httpx.get(f"{server.url}/metrics").text
    assert texts == [references[p] for p in PROMPTS]
    name = "specops:batch_size"
    passes = metric(after, f"{name}_count") - metric(before, f"{name}_count")
    requests_in_passes = metric(after, f"{name}_sum") - metric(before, f"{name}_sum")
    assert passes > 0 and requests_in_passes / passes > 1.0  # requests shared passes


def test_a_skeleton_request_answers_point_by_point(client):
    response = ask(client, "How do I plan a birthday party?", extra_body={"skeleton": True})
    skeleton = response.model_extra["skeleton"]
    text = response.choices[0].message.content
    if skeleton["direct"]:
        assert skeleton["plan"] == "[DIRECT]" and text
    else:
        assert skeleton["plan"].startswith("[PLAN]\n1. ") and skeleton["plan"].endswith("[END]")
        assert 2 <= len(skeleton["points"]) <= 6
        for i, point in enumerate(skeleton["points"], start=1):
            assert f"{i}. {point}:" in text
    assert response.usage.completion_tokens > 0
    with pytest.raises(openai.BadRequestError, match="not streamed"):
        ask(client, "How do I plan a party?", stream=True, extra_body={"skeleton": True})


@pytest.mark.parametrize(
    "drafter",
    ["none", "pld", "ngram:3", "ngram:3,fallback=target", "ngram:4,min_conf=0.5", "layers:2"],
)
def test_every_per_request_drafter_is_lossless(client, references, drafter):
    response = ask(client, PROMPTS[0], extra_body={"drafter": drafter, "num_speculative_tokens": 4})
    assert response.choices[0].message.content == references[PROMPTS[0]]
    assert response.usage.model_extra["speculative"]["draft_version"] == (
        "1" if drafter == "champion" else drafter
    )


def test_completions_endpoint(client):
    response = client.completions.create(
        model="smollm2", prompt="def fibonacci(n):", max_tokens=16, temperature=0
    )
    assert response.choices[0].text and response.usage.completion_tokens == 16
    assert response.choices[0].finish_reason == "length"


def test_metrics_change_after_requests(server, client):
    before = httpx.get(f"{server.url}/metrics").text
    ask(client, PROMPTS[3])
    after = httpx.get(f"{server.url}/metrics").text
    for name in (
        "specops:request_success_total",
        "specops:generation_tokens_total",
        "specops:prompt_tokens_total",
        "specops:spec_decode_num_checks_total",
        "specops:e2e_request_latency_seconds_count",
    ):
        assert metric(after, name) > metric(before, name), name
    assert metric(after, "specops:num_requests_running") == 0


def test_bad_requests_are_refused_and_the_server_keeps_serving(server, client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    for fields in ({"max_tokens": 0}, {"max_tokens": 100000}, {"temperature": 9}, {"top_p": 0}):
        with pytest.raises(openai.BadRequestError):
            ask(client, "hello", **fields)
    with pytest.raises(openai.BadRequestError, match="context"):
        ask(client, "word " * 9000)
    raw = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=b"{broken",
        headers={"content-type": "application/json"},
    )
    assert raw.status_code == 400 and "error" in raw.json()
    assert ask(client, "hello").choices[0].message.content


def test_a_disconnected_stream_is_cancelled(server):
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 1000,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
    # 1000 tokens would take well over 10 s; a cancelled request frees the worker at once.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        health = httpx.get(f"{server.url}/health").json()
        if health["requests_running"] == 0:
            break
        time.sleep(0.5)
    assert health["requests_running"] == 0


def test_load_test_reports_its_figures(server, tmp_path):
    settings = LoadTestSettings(
        url=server.url, clients=2, requests=4, max_tokens=12, prompts=PROMPTS
    )
    results = asyncio.run(run_load_test(settings, progress=False))
    assert results["succeeded"] == 4 and results["errors"] == 0
    assert results["latency_s"]["p50"] > 0 and results["tokens_per_s"] > 0
    assert results["server_rss_mb"]["peak"] > 100


def test_hot_swap_under_load_drops_nothing(server, champion, references):
    """Requests admitted with draft 1 are still decoding when the server swaps to draft 2
    (asserted: /health reports the new draft and requests in flight at once, and nothing
    else was sent), finish on draft 1 with the engine's output, and later requests get
    draft 2."""
    pointer, packages = champion
    load = PROMPTS * 4  # 16 requests: two waves of max_active=8, seconds of decoding

    async def one(client, prompt):
        response = await client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=24,
            temperature=0,
        )
        return prompt, response

    async def wait_for(http, condition, what: str) -> dict:
        """The first /health answer that meets ``condition``."""
        deadline = time.monotonic() + 120
        while True:
            state = (await http.get(f"{server.url}/health")).json()
            if condition(state):
                return state
            assert time.monotonic() < deadline, f"no {what} in 120 s; last /health: {state}"
            await asyncio.sleep(0.05)

    async def swap_under_load():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        async with httpx.AsyncClient(timeout=10) as http:
            tasks = [asyncio.create_task(one(client, p)) for p in load]
            # Every request admitted (queued or decoding, or already answered) before the
            # promotion: each was given draft 1.
            await wait_for(
                http,
                lambda h: h["requests_running"] + h["requests_waiting"]
                + sum(t.done() for t in tasks) >= len(load),
                "the load to be admitted",
            )  # fmt: skip
            point(pointer, packages["ngram"], "2")  # promotion, mid-load
            swapped = await wait_for(http, lambda h: h["draft"]["version"] == "2", "the swap")
            first = await asyncio.gather(*tasks)
            second = await asyncio.gather(*(one(client, p) for p in PROMPTS))
        await client.close()
        return swapped, first, second

    swapped, first, second = asyncio.run(swap_under_load())
    in_flight = swapped["requests_running"] + swapped["requests_waiting"]
    assert in_flight > 0, (
        f"the load had finished before the swap (poll every {CHAMPION_POLL_S} s); "
        "nothing was in flight to drop"
    )
    for prompt, response in [*first, *second]:
        assert response.choices[0].message.content == references[prompt]
    assert {r.usage.model_extra["speculative"]["draft_version"] for _, r in first} == {"1"}
    assert {r.usage.model_extra["speculative"]["draft_version"] for _, r in second} == {"2"}
    health = httpx.get(f"{server.url}/health").json()
    drafter = health["draft"]["drafter"]
    assert drafter.startswith("ngram:4,fallback=shared,store=") and health["draft_swaps"] == 1
    assert metric(httpx.get(f"{server.url}/metrics").text, "specops:draft_swaps_total") == 1


def test_a_full_queue_answers_429_and_captures_go_to_the_store(tmp_path):
    args = [
        "--drafter", "pld", "--queue-size", "1", "--max-active", "1",
        "--capture-share", "1.0", "--store", str(tmp_path / "store"),
    ]  # fmt: skip
    server = ServerProcess(args, log_path=tmp_path / "server.log").start()
    try:

        async def burst():
            client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
            calls = [
                client.chat.completions.create(
                    model="smollm2",
                    messages=[{"role": "user", "content": f"Count to {n}."}],
                    max_tokens=16,
                    temperature=0,
                )
                for n in range(6)
            ]
            results = await asyncio.gather(*calls, return_exceptions=True)
            await client.close()
            return results

        results = asyncio.run(burst())
    finally:
        # A graceful shutdown flushes the captured records; uvicorn then re-raises the
        # SIGTERM it caught, so the exit status is -15 rather than 0.
        assert server.stop() in (0, -15)
    refused = [r for r in results if isinstance(r, openai.RateLimitError)]
    served = [r for r in results if not isinstance(r, Exception)]
    assert refused and served and len(refused) + len(served) == 6
    assert refused[0].body["type"] == "rate_limit_error"
    assert store.part_files(tmp_path / "store")
    result = validate_store(tmp_path / "store", known_hardware=["cpu"], run_id="t")
    assert result.summary.valid == len(served) and result.summary.quarantined == 0
