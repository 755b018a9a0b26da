"""The admission middleware in front of a small Starlette app: a refusal is a 429 with
Retry-After and OpenAI's error body, and the app never sees the refused request."""

import time

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from serving.security.admission import Admission, Refusal
from serving.security.rate import TokenBuckets


@pytest.fixture
def make():
    def build(*, buckets=None, busy=lambda: None, keyed=False, **held):
        seen: list[str] = []
        rejected: list[tuple[int, str]] = []

        async def echo(request: Request):
            seen.append(request.url.path)
            return JSONResponse({"ok": True})

        inner = Starlette(
            routes=[
                Route("/v1/completions", echo, methods=["POST"]),
                Route("/v1/models", echo, methods=["GET"]),
                Route("/health", echo, methods=["GET"]),
            ]
        )
        app = Admission(
            inner,
            paths={"/v1/completions"},
            buckets=buckets,
            keyed=keyed,
            busy=busy,
            on_reject=lambda status, reason: rejected.append((status, reason)),
            **held,
        )
        return TestClient(app), seen, rejected

    return build


def test_a_busy_server_refuses_before_the_app_sees_the_request(make):
    client, seen, rejected = make(busy=lambda: Refusal("queue_full", "the queue is full", 7))
    response = client.post("/v1/completions", json={"prompt": "x"})
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "7"
    assert response.json()["error"] == {
        "message": "the queue is full",
        "type": "rate_limit_error",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert not seen and rejected == [(429, "queue_full")]
    # health and other routes pass while busy
    assert client.get("/health").status_code == 200
    assert client.get("/v1/models").status_code == 200


def test_each_address_has_its_bucket(make):
    client, seen, rejected = make(buckets=TokenBuckets(0.01, 2))
    assert [client.post("/v1/completions").status_code for _ in range(3)] == [200, 200, 429]
    refused = client.post("/v1/completions")
    assert int(refused.headers["Retry-After"]) == 100  # one token in 1/0.01 s
    assert "limits.rate_per_s" in refused.json()["error"]["message"]
    assert "per client address" in refused.json()["error"]["message"]
    assert rejected == [(429, "rate_limit")] * 2 and len(seen) == 2


def test_keyed_buckets_follow_the_key(make):
    client, _, _ = make(buckets=TokenBuckets(0.01, 1), keyed=True)
    one, two = ({"Authorization": f"Bearer sk-{n}"} for n in (1, 2))
    assert client.post("/v1/completions", headers=one).status_code == 200
    assert client.post("/v1/completions", headers=one).status_code == 429
    assert client.post("/v1/completions", headers=two).status_code == 200


def test_a_busy_refusal_spends_no_token(make):
    busy = [True]
    client, _, _ = make(
        buckets=TokenBuckets(0.01, 1),
        busy=lambda: Refusal("queue_full", "full", 1) if busy[0] else None,
    )
    assert client.post("/v1/completions").status_code == 429
    busy[0] = False
    assert client.post("/v1/completions").status_code == 200


def test_a_refusal_is_held_for_the_delay_unless_too_many_are_held(make):
    def full():
        return Refusal("queue_full", "full", 1)

    client, _, _ = make(busy=full, delay_s=0.3)
    started = time.perf_counter()
    assert client.post("/v1/completions").status_code == 429
    assert time.perf_counter() - started >= 0.3
    client, _, _ = make(busy=full, delay_s=30, max_held=0)
    started = time.perf_counter()
    assert client.post("/v1/completions").status_code == 429
    assert time.perf_counter() - started < 5
