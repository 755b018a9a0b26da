"""Token buckets, one per client: each holds up to ``burst`` tokens and refills at
``rate_per_s``; a request takes one or is refused, told how long until one is there.

A client is its API key (a SHA-256 digest of it, never the key) where the server has keys,
else its address. The buckets live in one process's memory, at most ``max_clients`` of
them: the least recently seen is forgotten first (a forgotten client starts full again,
which costs a burst, not a bypass of the rate). Used from the event loop's thread only.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_CLIENTS = 10_000


@dataclass
class _Bucket:
    tokens: float
    at: float  # when ``tokens`` was counted


class TokenBuckets:
    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(
                f"a token bucket needs rate_per_s > 0 and burst >= 1, got {rate_per_s} and {burst}"
            )
        self.rate_per_s, self.burst, self.max_clients, self.clock = (
            rate_per_s,
            burst,
            max_clients,
            clock,
        )
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def take(self, client: str) -> float:
        """Take a token for ``client``: 0.0 when it had one, else the seconds until it has."""
        now = self.clock()
        bucket = self._buckets.pop(client, None) or _Bucket(float(self.burst), now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate_per_s)
        bucket.at = now
        wait = 0.0
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
        else:
            wait = (1.0 - bucket.tokens) / self.rate_per_s
        self._buckets[client] = bucket  # the most recently seen last
        if len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return wait

    def retry_after_s(self, wait: float) -> int:
        """``wait`` as ``Retry-After``'s whole seconds, at least 1."""
        return max(1, math.ceil(wait))


def client_of(authorization: bytes | None, address: str | None, *, keyed: bool) -> str:
    """Who a request is for rate limiting: its key's digest on a server with keys (the
    guard has checked the key by then), else its address. Without keys a sent token is
    ignored: any token would buy a fresh bucket."""
    if keyed and authorization:
        return "key:" + hashlib.sha256(authorization.strip()).hexdigest()[:32]
    return f"addr:{address or 'unknown'}"
