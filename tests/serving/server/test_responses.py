"""The response models on the wire (tiny target, in-process): each body's keys in
OpenAI's order, nulls where OpenAI has nulls, a chat delta without absent keys, the usage
chunk last; the models document the endpoints in the OpenAPI schema."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from serving.server.responses import (
    ChatDelta,
    DraftInfo,
    SpeculationStats,
    SpeculativeUsage,
    UsageChunk,
    sse,
)

CHAT = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "Name three colours."}],
    "max_tokens": 4,
    "temperature": 0,
}
COMPLETION = {"model": "smollm2", "prompt": "abc abc", "max_tokens": 4, "temperature": 0}
ANSWER_KEYS = ["id", "object", "created", "model", "choices", "usage"]
USAGE_KEYS = ["prompt_tokens", "completion_tokens", "total_tokens", "speculative"]
SPECULATIVE_KEYS = [
    "draft_version",
    "checks",
    "draft_tokens",
    "accepted_tokens",
    "acceptance_rate",
    "mean_accepted_length",
    "acceptance_by_position",
    "unverified_positions",
]


def events(client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_a_completion_in_openais_shape(tiny_client):
    body = tiny_client.post("/v1/completions", json=COMPLETION).json()
    assert list(body) == ANSWER_KEYS
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"] == [
        {
            "index": 0,
            "finish_reason": "length",
            "text": body["choices"][0]["text"],
            "logprobs": None,
        }
    ]
    usage = body["usage"]
    assert list(usage) == USAGE_KEYS and list(usage["speculative"]) == SPECULATIVE_KEYS
    assert usage["completion_tokens"] == 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_a_chat_completion_in_openais_shape(tiny_client):
    body = tiny_client.post("/v1/chat/completions", json={**CHAT, "drafter": "none"}).json()
    assert list(body) == ANSWER_KEYS
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert list(choice) == ["index", "finish_reason", "message"]
    assert (
        list(choice["message"]) == ["role", "content"] and choice["message"]["role"] == "assistant"
    )
    speculative = body["usage"]["speculative"]
    assert speculative["draft_version"] == "none"
    assert speculative["acceptance_rate"] is None  # nothing drafted: null, not 0
    assert speculative["acceptance_by_position"] == [] and speculative["unverified_positions"] == []


def test_a_chat_stream_opens_with_the_role_and_ends_with_usage(tiny_client):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    chunks = events(tiny_client, "/v1/chat/completions", body)
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    for chunk in chunks[:-1]:
        assert list(chunk) == ["id", "object", "created", "model", "choices"]
        assert chunk["object"] == "chat.completion.chunk"
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all(list(d) == ["content"] for d in deltas[1:-1])
    assert deltas[-1] == {}  # the finish: no text, no nulls
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    last = chunks[-1]
    assert list(last) == ANSWER_KEYS and last["choices"] == []
    assert last["object"] == "chat.completion.chunk" and last["usage"]["completion_tokens"] == 4


def test_a_completion_stream_without_usage_has_no_usage_chunk(tiny_client):
    chunks = events(tiny_client, "/v1/completions", {**COMPLETION, "stream": True})
    assert all("usage" not in c for c in chunks)
    for chunk in chunks:
        assert chunk["object"] == "text_completion"
        assert list(chunk["choices"][0]) == ["index", "finish_reason", "text", "logprobs"]
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "finish_reason": "length",
        "text": "",
        "logprobs": None,
    }


def test_health_and_models_describe_the_serving_draft(tiny_client, tiny_state):
    health = tiny_client.get("/health").json()
    assert list(health) == [
        "status",
        "model",
        "hardware",
        "draft",
        "draft_swaps",
        "champion_error",
        "requests_running",
        "requests_waiting",
    ]
    assert health["status"] == "ok" and health["champion_error"] is None
    assert health["draft"] == tiny_state.watcher.current.describe()
    models = tiny_client.get("/v1/models").json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert list(card) == ["id", "object", "created", "owned_by", "max_model_len", "draft"]
    assert card["id"] == "smollm2" and card["max_model_len"] == tiny_state.max_context
    assert card["draft"] == health["draft"]


def test_the_openapi_schema_names_the_response_models(tiny_client):
    schemas = tiny_client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("Completion", "ChatCompletion", "SkeletonAnswer", "Health", "ModelList"):
        assert name in schemas
    assert "speculative" in schemas["SpeculativeUsage"]["properties"]


def test_a_chat_delta_sends_only_what_it_has():
    assert ChatDelta().model_dump() == {}
    assert ChatDelta(content="").model_dump() == {"content": ""}
    assert ChatDelta(role="assistant", content="hi").model_dump() == {
        "role": "assistant",
        "content": "hi",
    }


def test_the_usage_chunk_and_sse_lines():
    speculative = SpeculationStats.of(None, draft_version="v", unverified=[])
    usage = SpeculativeUsage.of(3, 2, speculative)
    chunk = UsageChunk(id="cmpl-1", object="text_completion", created=1, model="m", usage=usage)
    line = sse(chunk)
    assert line.startswith('data: {"id": "cmpl-1", "object": "text_completion"')
    assert line.endswith("\n\n")
    payload = json.loads(line.removeprefix("data: "))
    assert payload["choices"] == [] and payload["usage"]["total_tokens"] == 5
    assert payload["usage"]["speculative"]["checks"] == 0
    assert payload["usage"]["speculative"]["acceptance_rate"] is None


def test_a_draft_description_that_drifts_fails_loudly():
    described = {
        "version": "1",
        "source": "static",
        "drafter": "pld",
        "package": None,
        "policy": "cost",
        "k": 10,
        "loaded_at": 0.0,
    }
    assert DraftInfo.model_validate(described).model_dump() == described
    with pytest.raises(ValidationError, match="extra"):
        DraftInfo.model_validate({**described, "renamed": 1})
