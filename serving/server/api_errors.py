"""Errors as OpenAI answers them: :class:`APIError` carries the status and the error's
type and parameter; the handlers registered by ``create_app`` turn it, a body that fails
validation, and anything unexpected into ``{"error": {...}}`` (the shape shared with the
vLLM front, :func:`serving.security.asgi.error_body`), each counted in the metrics."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from serving.server.deps import server_state
from serving.server.schemas import error_body

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.headers, self.code = headers, code


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, kind="invalid_request_error", param=param)


def too_many(message: str, retry_after_s: int) -> APIError:
    """A 429 that tells the client when to come back."""
    return APIError(
        429,
        message,
        kind="rate_limit_error",
        headers={"Retry-After": str(retry_after_s)},
        code="rate_limit_exceeded",  # as the admission middleware's refusals
    )


async def on_api_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, APIError)
    server_state(request).metrics.error(error.status)
    return JSONResponse(
        error_body(error.message, kind=error.kind, param=error.param, code=error.code),
        status_code=error.status,
        headers=error.headers,
    )


async def on_invalid_body(request: Request, error: Exception) -> JSONResponse:
    """A 400 naming every field that failed (``param``: the first), not FastAPI's 422."""
    assert isinstance(error, RequestValidationError)
    server_state(request).metrics.error(400)
    problems = []
    param = None
    for item in error.errors():
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        param = param or where or None
        problems.append(f"{where}: {item.get('msg')}" if where else str(item.get("msg")))
    return JSONResponse(
        error_body("; ".join(problems), kind="invalid_request_error", param=param),
        status_code=400,
    )


async def on_unexpected(request: Request, error: Exception) -> JSONResponse:
    log.exception("unhandled error in %s", request.url.path)
    server_state(request).metrics.error(500)
    return JSONResponse(
        error_body(f"internal error: {type(error).__name__}: {error}", kind="server_error"),
        status_code=500,
    )


# What create_app registers, in this order.
HANDLERS = (
    (APIError, on_api_error),
    (Exception, on_unexpected),
    (RequestValidationError, on_invalid_body),
)
