"""The error handlers on a bare FastAPI app (the tiny server's state): a 429 raised in a
handler (the scheduler's full queue) carries Retry-After and OpenAI's error body, as the
admission middleware's refusals do."""

from fastapi import FastAPI
from fastapi.testclient import TestClient

from serving.server.api_errors import HANDLERS, too_many


def test_too_many_is_a_429_with_retry_after_and_openais_body(tiny_state):
    app = FastAPI()
    app.state.server = tiny_state  # the handlers count errors in its metrics

    @app.post("/v1/completions")
    async def full():
        raise too_many("the request queue is full (32 waiting); retry in 7 s", 7)

    for error, handler in HANDLERS:
        app.add_exception_handler(error, handler)
    response = TestClient(app).post("/v1/completions")
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "7"
    assert response.json()["error"] == {
        "message": "the request queue is full (32 waiting); retry in 7 s",
        "type": "rate_limit_error",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert 'status="429"' in tiny_state.metrics.render().decode()
