"""A pure ASGI middleware that refuses work before a byte of its body is read: a 429 with
``Retry-After`` and OpenAI's error body (``rate_limit_error``) when

- the server says it is busy (``busy()``: the engine's full queue, with the seconds its
  measured drain rate needs), or
- the client's token bucket is empty (:class:`serving.security.rate.TokenBuckets`, per API
  key, or per address on a server without keys).

Only ``POST`` to ``paths`` (the routes that decode) is admitted or refused; health checks,
``/metrics`` and model listings always pass, so probes and scrapers see a flood. A refusal
costs no parsing, tokenisation, routing or queue slot: about 0.2 ms of the event loop's
CPU on this machine, most of it uvicorn's HTTP parsing. That is still too much for clients
that retry the moment they are answered: such a storm sends as fast as it is refused
(64 users were refused 1,778 times a second, and half the server's CPU went to refusing:
docs/security.md, "Overload").
So a refusal is held ``delay_s`` before it is sent (``limits.refusal_delay_s``), which
paces a retrying client to one request per ``delay_s`` at no CPU cost; at most ``max_held``
are held at once. Each refusal is reported to ``on_reject(429, reason)`` (the servers count
them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass

from serving.security.asgi import (
    ASGIApp,
    OnReject,
    Receive,
    Scope,
    Send,
    header,
    ignore_rejection,
    send_error,
)
from serving.security.rate import TokenBuckets, client_of

# Refusals held at once at most; past it they are sent at once (an open-loop flood that
# does not wait for answers must not pile up sleeping requests without end).
MAX_HELD = 1024


@dataclass(frozen=True)
class Refusal:
    reason: str  # the metrics' label
    message: str
    retry_after_s: int


def _never_busy() -> Refusal | None:
    return None


class Admission:
    def __init__(
        self,
        app: ASGIApp,
        *,
        paths: Collection[str],
        buckets: TokenBuckets | None = None,
        keyed: bool = False,
        busy: Callable[[], Refusal | None] = _never_busy,
        on_reject: OnReject = ignore_rejection,
        delay_s: float = 0.0,
        max_held: int = MAX_HELD,
    ) -> None:
        """``keyed``: the server checks API keys (a client is then its key). ``delay_s``:
        how long a refusal is held before it is sent, while fewer than ``max_held`` are."""
        self.app, self.paths, self.buckets, self.keyed = app, set(paths), buckets, keyed
        self.busy, self.on_reject = busy, on_reject
        self.delay_s, self.max_held = delay_s, max_held
        self.held = 0  # refusals being held now

    def _verdict(self, scope: Scope) -> Refusal | None:
        refusal = self.busy()  # first: a busy server must not spend the client's tokens
        if refusal is not None or self.buckets is None:
            return refusal
        address = scope.get("client")
        client = client_of(
            header(scope, b"authorization"), address[0] if address else None, keyed=self.keyed
        )
        wait = self.buckets.take(client)
        if not wait:
            return None
        retry_after = self.buckets.retry_after_s(wait)
        per = "API key" if self.keyed else "client address"
        return Refusal(
            "rate_limit",
            f"rate limit: {self.buckets.rate_per_s:g} requests/s in bursts of at most "
            f"{self.buckets.burst} per {per} (limits.rate_per_s, limits.burst); "
            f"retry in {retry_after} s",
            retry_after,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or scope.get("path") not in self.paths
        ):
            await self.app(scope, receive, send)
            return
        refusal = self._verdict(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        self.on_reject(429, refusal.reason)
        if self.delay_s > 0 and self.held < self.max_held:
            self.held += 1
            try:
                await asyncio.sleep(self.delay_s)  # a sleeping refusal costs no CPU
            finally:
                self.held -= 1
        await send_error(
            send,
            429,
            refusal.message,
            kind="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(refusal.retry_after_s)},
        )
