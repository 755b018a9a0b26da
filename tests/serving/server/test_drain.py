"""The drain rate on a fake clock, and the Retry-After it gives."""

from serving.server.drain import MAX_RETRY_AFTER_S, UNKNOWN_RETRY_AFTER_S, DrainRate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_unknown_until_a_request_leaves_then_waiting_over_rate():
    clock = Clock()
    drain = DrainRate(window_s=10, clock=clock)
    assert drain.per_s() is None
    assert drain.retry_after_s(5) == UNKNOWN_RETRY_AFTER_S
    for _ in range(5):  # one request every 2 s
        clock.now += 2
        drain.record()
    assert drain.per_s() == 0.5
    assert drain.retry_after_s(3) == 6  # 3 waiting at 0.5/s
    assert drain.retry_after_s(0) == 1  # never below one second
    assert drain.retry_after_s(10_000) == MAX_RETRY_AFTER_S


def test_the_window_forgets_old_departures():
    clock = Clock()
    drain = DrainRate(window_s=10, clock=clock)
    clock.now = 5
    drain.record()
    assert drain.per_s() == 0.2  # over the 5 s of uptime
    clock.now = 30
    assert drain.per_s() is None
    drain.record()
    assert drain.per_s() == 0.1  # one in the last 10 s
