"""The app in-process (FastAPI's TestClient, lifespan included) on the real model: the
error paths and the response shapes. The real-process tests with the official openai
client are in test_live_server.py."""

import json

import pytest
from fastapi.testclient import TestClient

from serving.engine.build import build_decoder
from serving.server.app import create_app
from serving.server.config import load_server_config
from serving.server.state import build_state

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def client(real_packed, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    config = load_server_config(
        **{"capture.store": str(store), "limits.max_tokens": 64, "limits.queue_size": 4}
    )
    state = build_state(config, target=real_packed)
    with TestClient(create_app(state)) as test_client:
        yield test_client


def chat(client, **fields):
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 12,
        "temperature": 0,
        **fields,
    }
    return client.post("/v1/chat/completions", json=body)


def assert_openai_error(response, status, *needles):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for needle in needles:
        assert needle in error["message"]
    return error


def test_non_streaming_chat_equals_the_engine_greedy(client, real_packed):
    tokenizer = real_packed.tokenizer
    response = chat(client, drafter="pld")
    assert response.status_code == 200, response.text
    body = response.json()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours."}],
        add_generation_prompt=True,
        tokenize=True,
    )
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    plain = build_decoder(real_packed)  # stops at the target's end-of-sequence ids
    want = plain.generate(ids, max_new_tokens=12)
    assert body["choices"][0]["message"]["content"] == tokenizer.decode(
        want.token_ids, skip_special_tokens=True
    )
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(ids)
    assert usage["completion_tokens"] == len(want.token_ids)
    assert usage["speculative"]["draft_version"] == "pld"
    assert usage["speculative"]["checks"] >= 1


def test_streaming_completion_sends_chunks_then_done(client):
    body = {
        "model": "smollm2",
        "prompt": "def add(a, b):",
        "max_tokens": 10,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    full = client.post("/v1/completions", json={**body, "stream": False}).json()
    assert text == full["choices"][0]["text"]


def test_a_stop_sequence_ends_the_completion(client):
    free = chat(client, max_tokens=30).json()["choices"][0]["message"]["content"]
    word = free.split()[1]
    stopped = chat(client, max_tokens=30, stop=[word]).json()
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == free[: free.index(word)]


def test_models_health_and_metrics(client):
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["smollm2"]
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["draft"]["drafter"] == "pld"
    text = client.get("/metrics").text
    assert "specops:spec_decode_num_draft_tokens_total" in text
    assert "process_resident_memory_bytes" in text


@pytest.mark.parametrize(
    ("fields", "status", "needle"),
    [
        ({"model": "gpt-4"}, 404, "gpt-4"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"max_tokens": 65}, 400, "above this server's limit of 64"),
        ({"temperature": 3}, 400, "temperature"),
        ({"top_p": 0}, 400, "top_p"),
        ({"n": 3}, 400, "n=3"),
        ({"drafter": "model:/etc"}, 400, "not available per request"),
        ({"drafter": "layers:99"}, 400, "layers:N needs"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "   "}]}, 400, "conversation is empty"),
    ],
)
def test_bad_requests_get_openai_errors(client, fields, status, needle):
    assert_openai_error(chat(client, **fields), status, needle)


def test_a_prompt_longer_than_the_context_is_refused(client):
    error = assert_openai_error(
        chat(client, messages=[{"role": "user", "content": "word " * 9000}]),
        400,
        "exceeds the model's context",
    )
    assert error["param"] == "prompt"


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe", b'{"model": "smollm2"}'])
def test_malformed_bodies_get_400(client, raw):
    response = client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert_openai_error(response, 400)


def test_the_server_keeps_serving_after_bad_requests(client):
    chat(client, temperature=-1)
    client.post("/v1/completions", content=b"{")
    assert chat(client).status_code == 200
