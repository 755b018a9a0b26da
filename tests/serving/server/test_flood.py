"""Overload on the tiny in-process server: refusals come before the body is read, with
``Retry-After`` and OpenAI's error body, and the requests already admitted finish while a
flood of others is refused around them."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from fastapi.testclient import TestClient

from serving.security.keys import from_keys
from serving.server.app import create_app
from serving.server.config import load_server_config
from serving.server.state import build_state
from tests.serving.server.served import served_target

LEGIT, FLOOD, BURSTY, OTHER = (
    f"sk-{who}-0123456789" for who in ("legit", "flood", "bursty", "other")
)


@pytest.fixture(scope="module")
def client(model_folder, tmp_path_factory):
    """One decode slot, two queue places, buckets of 3 per key refilled every 2 s, each
    refusal held 0.2 s."""
    from transformers import AutoTokenizer

    from serving.models.tiny import tiny_llama

    config = load_server_config(
        **{
            "capture.store": str(tmp_path_factory.mktemp("store")),
            "limits.max_tokens": 64,
            "limits.max_active": 1,
            "limits.queue_size": 2,
            "limits.rate_per_s": 0.5,
            "limits.burst": 3,
            "limits.refusal_delay_s": 0.2,
            "threads": 1,
        }
    )
    threads = torch.get_num_threads()
    model = tiny_llama(vocab_size=49152, hidden_size=64, num_layers=2)
    target = served_target(model, AutoTokenizer.from_pretrained(model_folder))
    state = build_state(config, target=target)
    state.api_keys = from_keys([LEGIT, FLOOD, BURSTY, OTHER])
    try:
        with TestClient(create_app(state)) as test_client:
            yield test_client, state
    finally:
        torch.set_num_threads(threads)


def completion(client, key: str, max_tokens: int):
    body = {"model": "smollm2", "prompt": "abc abc abc", "max_tokens": max_tokens}
    return client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def assert_retry_after(response, reason_needle: str) -> int:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and reason_needle in error["message"]
    retry_after = int(response.headers["Retry-After"])
    assert retry_after >= 1
    return retry_after


def test_admitted_requests_finish_while_a_flood_is_refused(client, monkeypatch):
    test_client, state = client
    scheduler = state.scheduler
    # Decoding waits until the flood has been refused once: otherwise, on a busy machine,
    # the tiny target can finish a request before the next one is admitted, and the queue
    # never fills (seen in CI).
    release = threading.Event()
    step = scheduler._step

    def held_step(batch, active):
        release.wait(60)
        step(batch, active)

    monkeypatch.setattr(scheduler, "_step", held_step)
    seen: list = []
    with ThreadPoolExecutor(7) as pool:
        # Fill the decode slot and both queue places, then flood.
        legit = [pool.submit(completion, test_client, LEGIT, 64) for _ in range(3)]
        deadline = time.monotonic() + 30
        while scheduler.running + scheduler.waiting < 3:
            assert time.monotonic() < deadline, "the legitimate requests were not admitted"
            time.sleep(0.005)
        stop = threading.Event()

        def flood() -> list:
            answers = []
            while not stop.is_set():
                answers.append(completion(test_client, FLOOD, 1))
                seen.append(answers[-1].status_code)
            return answers

        flooders = [pool.submit(flood) for _ in range(4)]
        while 429 not in seen:
            assert time.monotonic() < deadline + 30, "the flood was never refused"
            time.sleep(0.005)
        release.set()
        answers = [future.result(timeout=60) for future in legit]
        stop.set()
        flooded = [answer for future in flooders for answer in future.result(timeout=60)]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
    refused = [answer for answer in flooded if answer.status_code == 429]
    assert refused, "the flood was never refused"
    assert all(answer.status_code in (200, 429) for answer in flooded)
    assert_retry_after(refused[0], "the request queue is full")
    for answer in refused:
        assert int(answer.headers["Retry-After"]) >= 1
    metrics = test_client.get("/metrics", headers={"Authorization": f"Bearer {LEGIT}"}).text
    assert 'reason="queue_full"' in metrics


def test_a_key_past_its_bucket_is_refused_and_others_are_not(client):
    test_client, _ = client
    for _ in range(3):  # the burst
        assert completion(test_client, BURSTY, 1).status_code == 200
    retry_after = assert_retry_after(completion(test_client, BURSTY, 1), "limits.rate_per_s")
    assert retry_after <= 2  # one token refills in 2 s at 0.5/s
    assert completion(test_client, OTHER, 1).status_code == 200
    metrics = test_client.get("/metrics", headers={"Authorization": f"Bearer {LEGIT}"}).text
    assert 'reason="rate_limit"' in metrics
