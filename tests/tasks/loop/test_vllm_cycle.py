"""The deployment cycle's load and health checks over TLS (the front served with a
certificate made for the test, the cycle's clients trusting its CA); the whole cycle runs in
the vLLM backend job (tests/backends/test_vllm_deploy.py)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from serving.gateway.vllm_process import free_port
from serving.security.tls import ca_context, server_tls, uvicorn_tls
from tasks.loop.vllm_cycle import Load, _wait_for


def _chat_app() -> Starlette:
    """An OpenAI chat endpoint (plain and streamed) and a front's /health."""

    async def chat(request: Request):
        body = await request.json()
        if body.get("stream"):

            async def events():
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                         "model": "specops",
                         "choices": [{"index": 0, "delta": {"content": "hi"}}]}  # fmt: skip
                yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        reply = {"id": "c", "object": "chat.completion", "created": 0, "model": "specops",
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": "hi"}}]}  # fmt: skip
        return JSONResponse(reply)

    async def health(request: Request):
        return JSONResponse({"upstream": {"champion": "v1"}})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health", health),
        ]
    )


@pytest.fixture
def tls_front(tls_files):
    port = free_port()
    tls = server_tls(tls_files.cert, tls_files.key)
    server = uvicorn.Server(
        uvicorn.Config(_chat_app(), port=port, log_level="warning", **uvicorn_tls(tls))
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    yield f"https://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_the_cycles_clients_reach_a_tls_front_with_its_ca(tls_front, tls_files):
    verify = ca_context(tls_files.ca)
    assert _wait_for(tls_front, "v1", timeout_s=5, verify=verify) > 0
    load = Load(tls_front, [[{"role": "user", "content": "x"}]], workers=1, max_tokens=4,
                pause_s=0.0, verify=verify)  # fmt: skip
    load.start()
    deadline = time.monotonic() + 10
    while load.outcomes["ok"] < 3 and time.monotonic() < deadline:  # plain and streamed
        time.sleep(0.02)
    load.stop()
    assert load.outcomes["ok"] >= 3 and not load.errors, load.errors


def test_without_the_ca_the_cycles_load_fails_every_request(tls_front):
    load = Load(tls_front, [[{"role": "user", "content": "x"}]], workers=1, max_tokens=4,
                pause_s=0.0)  # fmt: skip
    load.start()
    deadline = time.monotonic() + 10
    while not load.outcomes["failed"] and time.monotonic() < deadline:
        time.sleep(0.02)
    load.stop()
    assert load.outcomes["failed"] >= 1 and not load.outcomes["ok"]
    assert "APIConnectionError" in load.errors[0]
