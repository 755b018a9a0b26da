"""The front clients call: an OpenAI-compatible reverse proxy whose upstream is swapped live.

Every request is sent to the upstream that is current when it arrives and stays with it to
the end (its body streams through as it comes), and each upstream counts its requests in
flight. Moving traffic is one assignment (:meth:`Front.switch`): new requests go to the new
server at once, those in flight finish on the old one, and the supervisor stops the old
one only once it has drained (:meth:`Front.wait_drained`). With no upstream ready the front
answers 503 with an OpenAI-style error and ``Retry-After``; an upstream that fails mid-way is
a 502 naming it. ``/health`` is the front's own (200 only while an upstream serves);
``/metrics`` is the front's Prometheus registry.

Capture: completions and chat completions that ask for one choice are recorded as
request/response pairs of token ids (the prompt as vLLM tokenized it, the output) with
what the request's drafts achieved (vLLM's per-request ``metrics.speculative_decoding``,
which the deployment turns on). The front asks vLLM for the ids (``return_token_ids``) and
removes them from the answer again when the client did not ask, so the client sees what it
would see from vLLM directly (:mod:`serving.gateway.capture`).

Access and consent, as on the engine's server (:mod:`serving.security`): with API keys the
front answers 401 to a request without a right ``Authorization: Bearer`` key before reading
its body (``/health`` stays open; ``/metrics`` needs a key unless ``metrics_open``), a body
over ``max_body_bytes`` is a 413, one that is not a JSON object (or nests deeper than
``max_json_depth``) a 400, a client past its token bucket (``limits.rate_per_s``, per key
or address) a 429 with ``Retry-After``, and the key is not forwarded upstream. A request that
opts out (``"capture": false`` or ``"store": false`` in its body, or the header
``X-SpecOps-Capture: off``) is never captured; the deployment redacts the pairs it writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from serving.errors import BadInputError
from serving.gateway.capture import Transcript
from serving.hardware import HardwareTarget
from serving.security.admission import Admission
from serving.security.asgi import ApiKeyGuard, ASGIApp, BodyLimit
from serving.security.body import BodyError, parse_object
from serving.security.consent import CAPTURE_HEADER, header_consent
from serving.security.keys import ApiKeys
from serving.security.rate import TokenBuckets

log = logging.getLogger(__name__)

CAPTURED_PATHS = ("/v1/completions", "/v1/chat/completions")
# Hop-by-hop headers and those the proxy recomputes.
_DROPPED_HEADERS = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
    "host",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-connection",
    "authorization",  # the front's API key; the upstream on loopback takes none
    CAPTURE_HEADER.lower(),
}

# Bodies the front passes on unread; every other body must be a JSON object.
_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
REQUEST_TIMEOUT_S = 600.0


def openai_error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}},
        status_code=status,
        headers={"Retry-After": "5"} if status == 503 else None,
    )


@dataclass
class Upstream:
    """One server behind the front."""

    name: str
    url: str
    version: str  # the champion it serves
    speculative_config: dict[str, Any] | None
    pid: int | None = None
    started_at: float = field(default_factory=time.time)
    ready_s: float | None = None  # start-up to ready
    inflight: int = 0
    served: int = 0

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "champion": self.version,
            "speculative_config": self.speculative_config,
            "pid": self.pid,
            "ready_s": self.ready_s,
            "inflight": self.inflight,
            "served": self.served,
        }


def _forward_headers(headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROPPED_HEADERS}


class Front:
    """The proxy's state: the current upstream, the front's state line and its metrics."""

    def __init__(
        self,
        *,
        capture: Callable[[dict[str, Any]], None] | None = None,
        hardware: HardwareTarget | None = None,
        keys: ApiKeys | None = None,
        max_body_bytes: int = 1 << 20,
        max_json_depth: int = 64,
        metrics_open: bool = False,
        buckets: TokenBuckets | None = None,
        refusal_delay_s: float = 0.0,
    ) -> None:
        self.keys = keys or ApiKeys((), ())
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.buckets = buckets  # per API key (per address without keys); None: no rate limit
        self.refusal_delay_s = refusal_delay_s
        self.metrics_open = metrics_open
        self.upstream: Upstream | None = None
        self.state = "starting"
        self.last_error: str | None = None
        self.hardware = hardware
        self.capture = capture
        self.events: list[dict[str, Any]] = []  # switches, failures, restarts (newest last)
        self._lock = threading.Lock()
        self.metrics = CollectorRegistry()
        self.requests = Counter(
            "specops_gateway_requests",
            "Requests through the front, by outcome",
            ["outcome"],
            registry=self.metrics,
        )
        self.switches = Counter(
            "specops_gateway_switches", "Upstream switches", registry=self.metrics
        )
        self.restarts = Counter(
            "specops_gateway_restarts", "vLLM servers restarted after dying", registry=self.metrics
        )
        self.inflight = Gauge(
            "specops_gateway_inflight", "Requests in flight", registry=self.metrics
        )
        self.rejected = Counter(
            "specops_gateway_rejected",
            "Requests refused before vLLM saw them "
            "(401 API key, 413 body size, 400 body, 429 rate limit)",
            ["reason"],
            registry=self.metrics,
        )
        self.opt_outs = Counter(
            "specops_gateway_capture_opt_outs",
            "Requests whose client opted out of capture",
            registry=self.metrics,
        )
        self.redactions = Counter(
            "specops_gateway_capture_redactions",
            "Secrets redacted from captured pairs by kind (dropped:<why> for dropped pairs)",
            ["kind"],
            registry=self.metrics,
        )
        self.acceptance = Gauge(
            "specops_vllm_acceptance_rate",
            "Accepted over drafted tokens in the last scrape window (vLLM's counters)",
            ["hardware"],
            registry=self.metrics,
        )

    # ---------------------------------------------------------------- control (any thread)
    def event(self, kind: str, **details: Any) -> None:
        with self._lock:
            self.events.append({"event": kind, "at": time.time(), **details})
            del self.events[:-50]

    def switch(self, upstream: Upstream | None) -> Upstream | None:
        """Send new requests to ``upstream``; return the previous one (still draining)."""
        with self._lock:
            previous, self.upstream = self.upstream, upstream
        if upstream is not None:
            self.state = "serving"
        return previous

    def wait_drained(self, upstream: Upstream, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Wait until ``upstream`` has no request in flight; False if the time ran out."""
        deadline = time.monotonic() + timeout_s
        while upstream.inflight > 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(poll_s)
        return True

    def health(self) -> tuple[int, dict[str, Any]]:
        upstream = self.upstream
        body = {
            "status": self.state,
            "hardware": "" if self.hardware is None else self.hardware.name,
            "upstream": upstream.describe() if upstream else None,
            "last_error": self.last_error,
            "events": self.events[-10:],
        }
        return (200 if upstream is not None else 503), body

    # ---------------------------------------------------------------- the ASGI app
    def app(self) -> ASGIApp:
        """The proxy behind the body limit, behind the rate limit, behind the API-key
        guard: each refuses before a byte of the body is read."""

        def rejected(status: int, reason: str) -> None:
            self.requests.labels("rejected").inc()
            self.rejected.labels(reason).inc()

        open_paths = {"/health", *(("/metrics",) if self.metrics_open else ())}
        limited: ASGIApp = BodyLimit(self._starlette(), self.max_body_bytes, on_reject=rejected)
        if self.buckets is not None:
            limited = Admission(
                limited,
                paths=CAPTURED_PATHS,
                buckets=self.buckets,
                keyed=self.keys.enabled,
                on_reject=rejected,
                delay_s=self.refusal_delay_s,
            )
        return ApiKeyGuard(limited, self.keys, open_paths=open_paths, on_reject=rejected)

    def _starlette(self) -> Starlette:
        clients: list[httpx.AsyncClient] = []

        @contextlib.asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            clients.append(httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=5)))
            try:
                yield
            finally:
                await clients.pop().aclose()

        async def health(_: Request) -> Response:
            status, body = self.health()
            return JSONResponse(body, status_code=status)

        async def metrics(_: Request) -> Response:
            return Response(generate_latest(self.metrics), media_type=PROMETHEUS_TYPE)

        async def proxy(request: Request) -> Response:
            return await self._proxy(request, clients[0])

        return Starlette(
            routes=[
                Route("/health", health, methods=["GET"]),
                Route("/metrics", metrics, methods=["GET"]),
                Route("/{path:path}", proxy, methods=["GET", "POST", "DELETE", "PUT"]),
            ],
            lifespan=lifespan,
        )

    def _parse(self, request: Request, raw: bytes) -> dict[str, Any] | None:
        """The body as a JSON object (vLLM's API takes nothing else), or None for a body
        the front does not read: none, or a form (vLLM's audio uploads). A body nested
        deeper than ``max_json_depth``, not JSON or not an object raises :class:`BodyError`
        before vLLM sees it."""
        content_type = request.headers.get("content-type", "").lower()
        if not raw or content_type.startswith(_FORM_TYPES):
            return None
        return parse_object(raw, max_depth=self.max_json_depth)

    def _prepare(
        self, request: Request, body: bytes, payload: dict[str, Any] | None
    ) -> tuple[bytes, dict | None, bool]:
        """The body to send, the parsed request when this one is captured, and whether the
        front added ``return_token_ids`` (then it strips the ids from the answer)."""
        if self.capture is None or request.method != "POST" or payload is None:
            return body, None, False
        if request.url.path not in CAPTURED_PATHS:
            return body, None, False
        consent = payload.pop("capture", True)  # specops's field; vLLM does not know it
        header = header_consent(request.headers.get(CAPTURE_HEADER))  # checked in _proxy
        if consent is False or payload.get("store") is False or header is False:
            self.opt_outs.inc()
            return json.dumps(payload).encode(), None, False
        if payload.get("n", 1) != 1:
            return body, None, False
        added = not payload.get("return_token_ids")
        if added:
            payload["return_token_ids"] = True
            body = json.dumps(payload).encode()
        return body, payload, added

    def _claim(self) -> Upstream | None:
        """The current upstream with this request counted in flight on it, under the lock
        :meth:`switch` takes: once ``switch`` returns, every request that picked the old
        upstream is already counted there, so :meth:`wait_drained` cannot miss one."""
        with self._lock:
            upstream = self.upstream
            if upstream is not None:
                upstream.inflight += 1
        return upstream

    async def _proxy(self, request: Request, client: httpx.AsyncClient) -> Response:
        raw = await request.body()  # before choosing an upstream: a slow body holds none
        try:
            header_consent(request.headers.get(CAPTURE_HEADER))
            payload = self._parse(request, raw)
        except BadInputError as error:
            self.requests.labels("rejected").inc()
            if isinstance(error, BodyError):
                self.rejected.labels("body").inc()
            return openai_error(400, str(error), "invalid_request_error")
        upstream = self._claim()
        if upstream is None:
            self.requests.labels("unavailable").inc()
            detail = f": {self.last_error}" if self.last_error else ""
            return openai_error(
                503, f"no vLLM server is ready ({self.state}){detail}", "service_unavailable"
            )
        self.inflight.inc()
        body, captured, added = self._prepare(request, raw, payload)
        url = upstream.url + request.url.path
        if request.url.query:
            url += "?" + request.url.query
        started = time.time()
        try:
            outgoing = client.build_request(
                request.method, url, headers=_forward_headers(request.headers), content=body
            )
            response = await client.send(outgoing, stream=True)
        except httpx.HTTPError as error:
            self._done(upstream, "upstream_error")
            return openai_error(
                502, f"vLLM server {upstream.name} did not answer: {error}", "bad_gateway"
            )
        headers = _forward_headers(response.headers)
        streaming = response.headers.get("content-type", "").startswith("text/event-stream")
        transcript = Transcript() if captured is not None else None

        if not streaming:
            try:
                content = await response.aread()
            except httpx.HTTPError as error:
                self._done(upstream, "upstream_error")
                return openai_error(
                    502, f"vLLM server {upstream.name} failed mid-answer: {error}", "bad_gateway"
                )
            finally:
                await response.aclose()
            if transcript is not None and response.status_code == 200:
                content = transcript.read_answer(content, strip=added)
            self._done(upstream, "ok" if response.status_code < 500 else "upstream_error")
            self._record(transcript, captured, upstream, started, response.status_code)
            return Response(content, status_code=response.status_code, headers=headers)

        async def events() -> AsyncIterator[bytes]:
            outcome = "upstream_error"
            try:
                buffer = b""
                async for chunk in response.aiter_bytes():
                    if transcript is None:
                        yield chunk
                        continue
                    buffer += chunk
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        yield transcript.read_event(event, strip=added) + b"\n\n"
                if buffer:
                    yield buffer
                outcome = "ok"
            finally:
                await response.aclose()
                self._done(upstream, outcome)
                if outcome == "ok":
                    self._record(transcript, captured, upstream, started, response.status_code)

        return StreamingResponse(events(), status_code=response.status_code, headers=headers)

    def _done(self, upstream: Upstream, outcome: str) -> None:
        with self._lock:
            upstream.inflight -= 1
            upstream.served += 1
        self.inflight.dec()
        self.requests.labels(outcome).inc()

    def _record(
        self,
        transcript: Transcript | None,
        request: dict | None,
        upstream: Upstream,
        started: float,
        status: int,
    ) -> None:
        if transcript is None or request is None or self.capture is None or status != 200:
            return
        record = transcript.record(
            request,
            server=upstream.name,
            champion=upstream.version,
            speculative_config=upstream.speculative_config,
            hardware=self.hardware,
            started=started,
        )
        if record is None:
            return
        try:
            self.capture(record)
        except Exception as error:  # capture must never fail a served request
            log.warning("capture failed: %s", error)
