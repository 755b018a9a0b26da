"""Token buckets on a fake clock: a burst, then the rate; each client its own bucket."""

import pytest

from serving.security.rate import TokenBuckets, client_of


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_gives_its_burst_then_one_token_per_interval():
    clock = Clock()
    buckets = TokenBuckets(2.0, 3, clock=clock)
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5)  # one token in 1/rate seconds
    assert buckets.retry_after_s(0.5) == 1
    clock.now += 0.5
    assert buckets.take("a") == 0.0
    assert buckets.take("a") > 0
    clock.now += 60  # refills only up to the burst
    assert [buckets.take("a") for _ in range(4)][-1] > 0


def test_clients_have_their_own_buckets_and_the_oldest_is_forgotten():
    clock = Clock()
    buckets = TokenBuckets(0.1, 1, max_clients=2, clock=clock)
    assert buckets.take("a") == 0.0
    assert buckets.take("a") == pytest.approx(10.0)
    assert buckets.take("b") == 0.0
    assert buckets.take("c") == 0.0  # "a" is forgotten: it starts full again
    assert buckets.take("a") == 0.0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="rate_per_s > 0"):
        TokenBuckets(0, 1)


def test_a_client_is_its_key_digest_with_keys_and_its_address_without():
    keyed = client_of(b"Bearer sk-1", "10.0.0.1", keyed=True)
    assert keyed.startswith("key:") and "sk-1" not in keyed
    assert keyed != client_of(b"Bearer sk-2", "10.0.0.1", keyed=True)
    assert keyed == client_of(b"Bearer sk-1", "10.0.0.2", keyed=True)
    # without keys a token buys nothing: the address decides
    assert client_of(b"Bearer sk-1", "10.0.0.1", keyed=False) == "addr:10.0.0.1"
    assert client_of(None, None, keyed=False) == "addr:unknown"
