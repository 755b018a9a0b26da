"""The ``Authorization: Bearer <key>`` check every specops server makes, whatever carries
the header: the HTTP servers' ASGI guard (:mod:`serving.security.asgi`) and the gRPC target
server's interceptor (:mod:`serving.distributed.auth`, metadata ``authorization``)."""

from __future__ import annotations

from serving.security.keys import ApiKeys

MISSING = "no API key: send it as 'Authorization: Bearer <key>'"


def bearer_verdict(keys: ApiKeys, value: bytes | str | None) -> tuple[str, str] | None:
    """None when ``value`` (the header's value, or None when absent) carries one of
    ``keys``; else ``(reason, message)``, reason one of ``missing``, ``malformed``,
    ``invalid``. The message never shows the presented key."""
    if value is None:
        return "missing", MISSING
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return "malformed", "malformed Authorization header: it is not ASCII"
    elif not value.isascii():
        return "malformed", "malformed Authorization header: it is not ASCII"
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return "malformed", "malformed Authorization header: expected 'Bearer <key>'"
    if not keys.check(token):
        return "invalid", "invalid API key"
    return None
