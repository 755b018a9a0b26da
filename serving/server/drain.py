"""How fast the scheduler empties, and so how long a refused client should wait.

:class:`DrainRate` records each request that leaves the scheduler (finished, failed or
cancelled) and measures requests per second over the last ``window_s`` (over the uptime
while that is shorter). A full queue's 429 tells the client, in ``Retry-After``, the
seconds the queue ahead of it needs to drain at that rate: ``ceil(waiting / rate)``, at
least 1 and at most ``MAX_RETRY_AFTER_S``. With nothing finished in the window the rate is
unknown and the answer is the conservative ``UNKNOWN_RETRY_AFTER_S``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 60.0
UNKNOWN_RETRY_AFTER_S = 10
MAX_RETRY_AFTER_S = 120


class DrainRate:
    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.window_s, self.clock = window_s, clock
        self.started = clock()
        self._left: deque[float] = deque()  # when each request left, oldest first
        self._lock = threading.Lock()  # the workers record, the event loop reads

    def record(self) -> None:
        """One request left the scheduler (called from a worker thread)."""
        with self._lock:
            self._left.append(self.clock())

    def per_s(self) -> float | None:
        """Requests that left per second over the window; None when none did."""
        now = self.clock()
        with self._lock:
            while self._left and self._left[0] < now - self.window_s:
                self._left.popleft()
            left = len(self._left)
        if not left:
            return None
        return left / max(min(self.window_s, now - self.started), 1.0)

    def retry_after_s(self, waiting: int) -> int:
        """Whole seconds for ``waiting`` queued requests to drain at the measured rate."""
        rate = self.per_s()
        if rate is None:
            return UNKNOWN_RETRY_AFTER_S
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(waiting / rate)))
