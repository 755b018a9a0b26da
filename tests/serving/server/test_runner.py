"""Parsing one request on the tiny in-process server: a hostile or malformed body is a 400
with OpenAI's error body (never the parser's recursion as a 500), and the server goes on
serving."""

from __future__ import annotations

import pytest

COMPLETION = {"model": "smollm2", "prompt": "abc abc", "max_tokens": 2, "temperature": 0}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"[" * 900_000, "(limits.max_json_depth)"),  # the 900 KB body
        (b'{"model": ' + b"[" * 100 + b"]" * 100 + b"}", "at most 64 (limits.max_json_depth)"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, got list"),
    ],
)
def test_a_hostile_or_malformed_body_is_an_openai_400(tiny_client, raw, needle):
    response = tiny_client.post(
        "/v1/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"]
    assert tiny_client.post("/v1/completions", json=COMPLETION).status_code == 200
