"""API keys on the gRPC target server: a server interceptor that checks each call's
``authorization: Bearer <key>`` metadata against the server's keys (the same keys and the
same check as the HTTP servers', :mod:`serving.security.bearer`) before any handler runs.

A refused call gets ``UNAUTHENTICATED`` with the reason; its handler never runs, so it
reaches neither the session table nor the scheduler nor the model. Refusals are counted by
reason in :attr:`KeyInterceptor.refused`.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc

from serving.security.bearer import bearer_verdict
from serving.security.keys import ApiKeys

log = logging.getLogger(__name__)

MISSING_METADATA = (
    "no API key: send the call metadata 'authorization: Bearer <key>' (TargetClient's "
    "api_key; specops distributed client reads $SPECOPS_API_KEYS or --api-key-file)"
)


def _metadata(details: grpc.HandlerCallDetails, name: str) -> str | bytes | None:
    for key, value in details.invocation_metadata or ():  # type: ignore[attr-defined]
        if key == name:
            return value
    return None


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that ends the call with UNAUTHENTICATED."""

    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class KeyInterceptor(grpc.ServerInterceptor):
    """Lets a call through only with one of ``keys`` in its ``authorization`` metadata."""

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys
        self.refused: Counter[str] = Counter()
        self._lock = threading.Lock()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        verdict = bearer_verdict(self.keys, _metadata(handler_call_details, "authorization"))
        if verdict is None or handler is None:  # an unknown method stays UNIMPLEMENTED
            return handler
        reason, message = verdict
        if reason == "missing":
            message = MISSING_METADATA
        with self._lock:
            self.refused[reason] += 1
        log.warning("refused a %s call: %s API key", handler_call_details.method, reason)
        return _refusal(handler, message)
