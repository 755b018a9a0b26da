"""The front: requests go to the upstream current when they arrive and finish there; a
switch under load fails nothing; captured pairs carry token ids the client never sees
unless it asked; no upstream is a 503, a dead one a 502 (OpenAI-style errors)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from serving.gateway.front import Front, Upstream
from serving.gateway.vllm_process import free_port
from serving.hardware import hardware_target
from serving.security.keys import from_keys
from serving.security.rate import TokenBuckets
from serving.security.tls import ServerTls, ca_context, server_tls, uvicorn_tls

CPU_VLLM = hardware_target("cpu-vllm")


def fake_vllm(name: str, delay_s: float = 0.0, release: threading.Event | None = None) -> Starlette:
    """A stand-in for vLLM's completions endpoint: answers with its name and, when asked,
    the token ids vLLM adds (``return_token_ids``). With ``release``, every request is
    held until the test sets it."""

    async def completions(request: Request):
        body = await request.json()
        while release is not None and not release.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(delay_s)
        ids = body.get("return_token_ids", False)
        choice = {"index": 0, "text": f"from {name}", "finish_reason": "length"}
        metrics = {"speculative_decoding": {"num_draft_tokens": 6, "num_accepted_draft_tokens": 2,
                                            "per_step_drafted": [3, 3],
                                            "per_step_accepted": [2, 0]}}  # fmt: skip
        if ids:
            choice["token_ids"] = [7, 8, 9]
        if body.get("stream"):

            async def events():
                for i, token in enumerate([7, 8, 9]):
                    chunk = {"choices": [{"index": 0, "text": f"t{i}"}]}
                    if ids:
                        chunk["choices"][0]["token_ids"] = [token]
                        if i == 0:
                            chunk["choices"][0]["prompt_token_ids"] = [1, 2]
                    yield f"data: {json.dumps(chunk)}\n\n"
                    await asyncio.sleep(delay_s / 3)
                yield f"data: {json.dumps({'choices': [], 'metrics': metrics})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        payload = {"object": "text_completion", "server": name, "choices": [choice],
                   "metrics": metrics}  # fmt: skip
        if ids:
            payload["prompt_token_ids"] = [1, 2]
        return JSONResponse(payload)

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


class Served:
    """An ASGI app on a free loopback port, in a thread."""

    def __init__(self, app, tls: ServerTls | None = None) -> None:
        self.port = free_port()
        self.scheme = "https" if tls else "http"
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", **uvicorn_tls(tls)
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def served():
    started: list[Served] = []

    def serve(app, tls: ServerTls | None = None) -> Served:
        started.append(Served(app, tls))
        return started[-1]

    yield serve
    for server in started:
        server.stop()


def upstream(server: Served, name: str) -> Upstream:
    return Upstream(name=name, url=server.url, version=name, speculative_config=None)


def test_no_upstream_is_a_503_with_an_openai_error(served):
    front = Front(hardware=CPU_VLLM)
    front.last_error = "vLLM refused suffix/2: bad config"
    app = served(front.app())
    response = httpx.post(f"{app.url}/v1/completions", json={"prompt": "x"})
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"
    assert "bad config" in response.json()["error"]["message"]
    health = httpx.get(f"{app.url}/health")
    assert health.status_code == 503 and health.json()["last_error"].startswith("vLLM refused")


def test_a_dead_upstream_is_a_502_naming_it(served):
    front = Front()
    front.switch(Upstream(name="gone", url=f"http://127.0.0.1:{free_port()}", version="v",
                          speculative_config=None))  # fmt: skip
    app = served(front.app())
    response = httpx.post(f"{app.url}/v1/completions", json={"prompt": "x"})
    assert response.status_code == 502
    assert "gone" in response.json()["error"]["message"]
    assert front.upstream.inflight == 0


def _wait_until(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_switch_under_load_fails_nothing_and_drains_the_old(served):
    """The old server holds its eight requests until the test lets them go, so the switch
    lands with all eight in flight however slow the machine; the waits are on states."""
    release_old = threading.Event()
    old_server = served(fake_vllm("old", release=release_old))
    new_server = served(fake_vllm("new"))
    front = Front()
    old = upstream(old_server, "old")
    front.switch(old)
    app = served(front.app())

    def call(_):
        response = httpx.post(f"{app.url}/v1/completions", json={"prompt": "x"}, timeout=60)
        return response.status_code, response.json().get("server")

    with ThreadPoolExecutor(16) as pool:
        try:
            first = [pool.submit(call, i) for i in range(8)]
            assert _wait_until(lambda: old.inflight == 8)  # all eight in flight on the old
            new = upstream(new_server, "new")
            previous = front.switch(new)
            assert previous is old
            later = [pool.submit(call, i) for i in range(8)]
            later_results = [f.result(timeout=60) for f in later]  # the old still holds its own
            assert (old.inflight, old.served) == (8, 0)
            assert not front.wait_drained(old, timeout_s=0.05)
        finally:
            release_old.set()
        assert front.wait_drained(old, timeout_s=30)
        results = [f.result(timeout=60) for f in first] + later_results
    assert [status for status, _ in results] == [200] * 16
    assert [server for _, server in results[:8]] == ["old"] * 8  # finished where they began
    assert [server for _, server in results[8:]] == ["new"] * 8
    assert old.inflight == 0 and old.served == 8
    assert new.inflight == 0 and new.served == 8


@pytest.mark.parametrize("stream", [False, True])
def test_capture_records_ids_and_hides_them_from_the_client(served, stream):
    captured: list[dict] = []
    front = Front(capture=captured.append, hardware=CPU_VLLM)
    front.switch(upstream(served(fake_vllm("v1")), "v1"))
    app = served(front.app())
    body = {"prompt": "x", "max_tokens": 3, "temperature": 0, "stream": stream}
    response = httpx.post(f"{app.url}/v1/completions", json=body)
    assert response.status_code == 200
    assert "token_ids" not in response.text  # the front asked for them, not the client
    assert len(captured) == 1
    record = captured[0]
    assert record["prompt_token_ids"] == [1, 2] and record["output_token_ids"] == [7, 8, 9]
    assert record["hardware"] == "cpu-vllm" and record["champion"] == "v1"
    assert record["sampling"]["temperature"] == 0
    assert (record["draft_tokens"], record["accepted_tokens"]) == (6, 2)
    assert record["per_step_accepted"] == [2, 0]
    if stream:
        assert response.text.rstrip().endswith("data: [DONE]")


def test_a_client_that_asks_for_ids_keeps_them(served):
    captured: list[dict] = []
    front = Front(capture=captured.append)
    front.switch(upstream(served(fake_vllm("v1")), "v1"))
    app = served(front.app())
    body = {"prompt": "x", "return_token_ids": True}
    response = httpx.post(f"{app.url}/v1/completions", json=body)
    assert response.json()["choices"][0]["token_ids"] == [7, 8, 9]
    assert len(captured) == 1


def test_front_metrics_count_outcomes(served):
    front = Front()
    app = served(front.app())
    httpx.post(f"{app.url}/v1/completions", json={"prompt": "x"})
    text = httpx.get(f"{app.url}/metrics").text
    assert 'specops_gateway_requests_total{outcome="unavailable"} 1.0' in text


KEY = "sk-front-key-0123456789abcdef"


def test_keys_guard_the_front_and_opt_outs_are_not_captured(served):
    """The fake vLLM records what reached it: never the key, never an unauthorised body."""
    seen: list[dict] = []
    fake = fake_vllm("up")

    async def spy(scope, receive, send):
        if scope["type"] == "http":
            seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await fake(scope, receive, send)

    server = served(spy)
    captured: list[dict] = []
    front = Front(capture=captured.append, keys=from_keys([KEY]), max_body_bytes=4096)
    front.switch(upstream(server, "up"))
    app = served(front.app())
    url = f"{app.url}/v1/completions"
    assert httpx.post(url, json={"prompt": "x"}).status_code == 401
    assert (
        httpx.post(url, json={"prompt": "x"}, headers={"Authorization": "Bearer"}).status_code
        == 401
    )
    assert httpx.get(f"{app.url}/health").status_code == 200
    assert httpx.get(f"{app.url}/metrics").status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(url, json={"prompt": "x" * 5000}, headers=auth).status_code == 413
    assert not seen, "a refused request reached vLLM"
    assert httpx.post(url, json={"prompt": "a"}, headers=auth).status_code == 200
    opted = [
        ({"prompt": "b", "capture": False}, auth),
        ({"prompt": "c", "store": False}, auth),
        ({"prompt": "d"}, {**auth, "X-SpecOps-Capture": "off"}),
    ]
    for body, headers in opted:
        assert httpx.post(url, json=body, headers=headers).status_code == 200
    maybe = httpx.post(url, json={"prompt": "e"}, headers={**auth, "X-SpecOps-Capture": "maybe"})
    assert maybe.status_code == 400 and "'maybe' is not one of on/off" in maybe.text
    assert len(captured) == 1 and len(seen) == 4
    assert all("authorization" not in headers for headers in seen), "the key went upstream"
    metrics = httpx.get(f"{app.url}/metrics", headers=auth).text
    assert "specops_gateway_capture_opt_outs_total 3.0" in metrics
    assert 'specops_gateway_rejected_total{reason="body_size"} 1.0' in metrics


def test_the_front_serves_tls_itself(served, tls_files):
    """uvicorn's own TLS with a certificate generated for the test: a client with the CA
    file and the key gets its completion; one that trusts only the system's CAs, or speaks
    plain HTTP to the port, gets nothing."""
    fake = served(fake_vllm("up"))
    front = Front(keys=from_keys([KEY]))
    front.switch(upstream(fake, "up"))
    app = served(front.app(), tls=server_tls(tls_files.cert, tls_files.key))
    assert app.url.startswith("https://")
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(verify=ca_context(tls_files.ca)) as client:
        assert client.post(f"{app.url}/v1/completions", json={"prompt": "a"}).status_code == 401
        reply = client.post(f"{app.url}/v1/completions", json={"prompt": "a"}, headers=auth)
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"]
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{app.url}/health", verify=ca_context(None))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{app.port}/health")


def test_a_body_that_is_not_a_shallow_json_object_is_a_400_vllm_never_sees(served):
    seen: list[str] = []
    fake = fake_vllm("up")

    async def spy(scope, receive, send):
        if scope["type"] == "http":
            seen.append(scope["path"])
        await fake(scope, receive, send)

    front = Front(capture=lambda pair: None, max_json_depth=8)
    front.switch(upstream(served(spy), "up"))
    url = f"{served(front.app()).url}/v1/completions"
    json_type = {"content-type": "application/json"}
    hostile = [
        (b"[" * 900_000, "at most 8 (limits.max_json_depth)"),
        (b'{"prompt": ' + b"[" * 9 + b"]" * 9 + b"}", "at most 8 (limits.max_json_depth)"),
        (b"{not json", "not valid JSON"),
        (b'["a list"]', "must be a JSON object, got list"),
    ]
    for raw, needle in hostile:
        response = httpx.post(url, content=raw, headers=json_type)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and needle in error["message"]
    assert not seen, "a refused body reached vLLM"
    assert httpx.post(url, json={"prompt": "ok"}).status_code == 200
    metrics = httpx.get(f"{url.rsplit('/v1', 1)[0]}/metrics").text
    assert 'specops_gateway_rejected_total{reason="body"} 4.0' in metrics


def test_a_client_past_its_bucket_is_a_429_with_retry_after(served):
    front = Front(buckets=TokenBuckets(0.01, 1))
    front.switch(upstream(served(fake_vllm("up")), "up"))
    app = served(front.app())
    url = f"{app.url}/v1/completions"
    assert httpx.post(url, json={"prompt": "a"}).status_code == 200
    refused = httpx.post(url, json={"prompt": "b"})
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "100"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert httpx.get(f"{app.url}/health").status_code == 200  # probes pass
    metrics = httpx.get(f"{app.url}/metrics").text
    assert 'specops_gateway_rejected_total{reason="rate_limit"} 1.0' in metrics
