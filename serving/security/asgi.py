"""Two pure ASGI middlewares that run before any route, so refused requests cost no body
parsing, no tokenisation and no queue slot:

- :class:`ApiKeyGuard`: ``Authorization: Bearer <key>`` (how OpenAI clients send
  ``api_key``); a missing, malformed or wrong key is a 401 with OpenAI's error body and
  ``WWW-Authenticate: Bearer``. Paths in ``open_paths`` (``/health``; ``/metrics`` when
  configured) need no key.
- :class:`BodyLimit`: a body over ``max_bytes`` is a 413, refused from its
  ``Content-Length`` before a byte is read, or as soon as a chunked body passes the limit.

Both report each refusal to ``on_reject(status, reason)`` (the servers count them).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

from serving.security.bearer import MISSING, bearer_verdict
from serving.security.keys import ApiKeys

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
OnReject = Callable[[int, str], None]


def error_body(message: str, *, kind: str, param: str | None = None, code: str | None = None):
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def send_error(
    send: Send,
    status: int,
    message: str,
    *,
    kind: str,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    payload = json.dumps(error_body(message, kind=kind, code=code)).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


def ignore_rejection(status: int, reason: str) -> None:
    """The default ``on_reject``: count nothing."""
    return None


class ApiKeyGuard:
    def __init__(
        self,
        app: ASGIApp,
        keys: ApiKeys,
        *,
        open_paths: Collection[str] = ("/health",),
        on_reject: OnReject = ignore_rejection,
    ) -> None:
        self.app, self.keys, self.open_paths, self.on_reject = app, keys, set(open_paths), on_reject

    def _verdict(self, scope: Scope) -> tuple[str, str] | None:
        """None when the request may pass; else (reason, message)."""
        verdict = bearer_verdict(self.keys, header(scope, b"authorization"))
        if verdict is not None and verdict[0] == "missing":
            return "missing", f"{MISSING} (the openai client's api_key)"
        return verdict

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.keys.enabled
            or scope.get("method") == "OPTIONS"
            or scope.get("path") in self.open_paths
        ):
            await self.app(scope, receive, send)
            return
        verdict = self._verdict(scope)
        if verdict is None:
            await self.app(scope, receive, send)
            return
        reason, message = verdict
        self.on_reject(401, reason)
        await send_error(
            send,
            401,
            message,
            kind="invalid_request_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, *, on_reject: OnReject = ignore_rejection
    ) -> None:
        self.app, self.max_bytes, self.on_reject = app, max_bytes, on_reject

    def _too_large(self, size: int | None) -> str:
        said = f"{size} bytes" if size is not None else "more"
        return (
            f"the request body has {said}; this server takes at most {self.max_bytes} bytes "
            "(limits.max_body_bytes)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = header(scope, b"content-length")
        if declared is not None:
            try:
                size = int(declared)
                if size < 0:
                    raise ValueError
            except ValueError:
                self.on_reject(400, "content_length")
                await send_error(
                    send,
                    400,
                    f"the Content-Length header {declared.decode('latin-1')!r} is not a size",
                    kind="invalid_request_error",
                )
                return
            if size > self.max_bytes:
                self.on_reject(413, "body_size")
                await send_error(send, 413, self._too_large(size), kind="invalid_request_error")
                return
        # Read the whole body (at most max_bytes) before the app sees it, then replay it;
        # later messages (a disconnect) pass through.
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([], message, receive), send)
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                self.on_reject(413, "body_size")
                await send_error(send, 413, self._too_large(None), kind="invalid_request_error")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], None, receive), send)


def _replay(messages: list[Message], last: Message | None, receive: Receive) -> Receive:
    pending = [*messages, *([last] if last is not None else [])]

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
