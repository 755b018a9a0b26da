"""The API-key guard and the body limit, in front of a small Starlette app."""

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from serving.security.asgi import ApiKeyGuard, BodyLimit
from serving.security.keys import from_keys

KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def app():
    seen: list[int] = []
    rejected: list[tuple[int, str]] = []

    async def echo(request: Request):
        body = await request.body()
        seen.append(len(body))
        return JSONResponse({"bytes": len(body)})

    async def health(request: Request):
        return JSONResponse({"status": "ok"})

    inner = Starlette(
        routes=[
            Route("/v1/completions", echo, methods=["POST"]),
            Route("/health", health),
            Route("/metrics", health),
        ]
    )
    limited = BodyLimit(inner, 2048, on_reject=lambda s, r: rejected.append((s, r)))
    guarded = ApiKeyGuard(limited, from_keys([KEY]), on_reject=lambda s, r: rejected.append((s, r)))
    return TestClient(guarded), seen, rejected


def test_the_right_key_passes(app):
    client, seen, rejected = app
    response = client.post(
        "/v1/completions", json={"a": 1}, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert response.status_code == 200 and seen and not rejected


@pytest.mark.parametrize(
    ("headers", "reason", "needle"),
    [
        ({}, "missing", "no API key"),
        ({"Authorization": "Bearer wrong-key-0123456789"}, "invalid", "invalid API key"),
        ({"Authorization": f"Basic {KEY}"}, "malformed", "expected 'Bearer <key>'"),
        ({"Authorization": "Bearer"}, "malformed", "expected 'Bearer <key>'"),
        ({"Authorization": f"Bearer {KEY} extra"}, "malformed", "expected 'Bearer <key>'"),
        ({"Authorization": "Bearer caf\u00e9".encode("latin-1")}, "malformed", "not ASCII"),
    ],
)
def test_a_missing_malformed_or_wrong_key_is_an_openai_401(app, headers, reason, needle):
    client, seen, rejected = app
    response = client.post("/v1/completions", content=b"{}", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert needle in error["message"] and error["code"] == "invalid_api_key"
    assert error["type"] == "invalid_request_error"
    assert not seen, "the app never saw the request"
    assert rejected == [(401, reason)]
    assert KEY not in response.text


def test_health_is_open_and_metrics_is_not(app):
    client, _, _ = app
    assert client.get("/health").status_code == 200
    assert client.get("/metrics").status_code == 401


def test_an_oversized_body_is_413_from_its_length(app):
    client, seen, rejected = app
    auth = {"Authorization": f"Bearer {KEY}"}
    response = client.post("/v1/completions", content=b"x" * 4096, headers=auth)
    assert (
        response.status_code == 413 and "at most 2048 bytes" in response.json()["error"]["message"]
    )
    assert not seen and rejected == [(413, "body_size")]


def test_an_oversized_chunked_body_is_413_too(app):
    client, seen, rejected = app
    assert not rejected

    def chunks():
        for _ in range(8):
            yield b"y" * 1000

    auth = {"Authorization": f"Bearer {KEY}"}
    response = client.post("/v1/completions", content=chunks(), headers=auth)
    assert response.status_code == 413 and not seen and rejected == [(413, "body_size")]


def test_a_body_within_the_limit_reaches_the_app_whole(app):
    client, _, _ = app

    def chunks():
        for _ in range(2):
            yield b"z" * 1000

    auth = {"Authorization": f"Bearer {KEY}"}
    response = client.post("/v1/completions", content=chunks(), headers=auth)
    assert response.status_code == 200 and response.json() == {"bytes": 2000}


def test_a_bad_content_length_is_400(app):
    client, seen, _ = app
    assert not seen
    auth = {"Authorization": f"Bearer {KEY}", "Content-Length": "lots"}
    response = client.post("/v1/completions", content=b"{}", headers=auth)
    assert response.status_code == 400 and "'lots' is not a size" in response.text
