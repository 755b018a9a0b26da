import queue
import time

import pytest

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.errors import SpecOpsError
from serving.server.drain import UNKNOWN_RETRY_AFTER_S
from serving.server.scheduler import Job, QueueFullError, Scheduler


def decoder(loaded):
    return SpeculativeDecoder(loaded, drafter=PromptLookupDrafter(), policy=FixedK(3))


class Collector:
    def __init__(self) -> None:
        self.events: queue.Queue = queue.Queue()

    def emit(self, kind, payload) -> None:
        self.events.put((kind, payload))

    def drain(self, timeout: float = 60.0) -> tuple[list[int], str, object]:
        tokens = []
        deadline = time.monotonic() + timeout
        while True:
            kind, payload = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            if kind == "token":
                tokens.append(payload.token_id)
                continue
            return tokens, kind, payload


def job(generation, collector, *, deadline_s: float = 60.0) -> Job:
    return Job(generation, collector.emit, deadline=time.monotonic() + deadline_s)


@pytest.mark.parametrize(("workers", "max_active"), [(1, 3), (2, 4)])
def test_batched_requests_decode_exactly_as_one_at_a_time(loaded, prompt, workers, max_active):
    prompts = [prompt, prompt[3:], [7, 7, 8, 9, 7, 7, 8], prompt[:5], prompt[1:9]]
    expected = [decoder(loaded).generate(p, max_new_tokens=30).token_ids for p in prompts]
    scheduler = Scheduler(queue_size=8, max_active=max_active, workers=workers)
    collectors = [Collector() for _ in prompts]
    for p, collector in zip(prompts, collectors, strict=True):
        # Each request has its own decoder (own drafter state and KV cache).
        scheduler.submit(job(decoder(loaded).stream(p, max_new_tokens=30), collector))
    scheduler.start()
    try:
        outputs = [collector.drain() for collector in collectors]
    finally:
        scheduler.stop()
    for (tokens, kind, result), want in zip(outputs, expected, strict=True):
        assert kind == "done"
        assert tokens == want == result.token_ids


def test_a_full_queue_refuses_at_once(loaded, prompt):
    scheduler = Scheduler(queue_size=2, max_active=1)  # not started: nothing leaves the queue
    for _ in range(2):
        scheduler.submit(job(decoder(loaded).stream(prompt, max_new_tokens=4), Collector()))
    assert scheduler.full
    with pytest.raises(QueueFullError, match="queue is full") as refused:
        scheduler.submit(job(decoder(loaded).stream(prompt, max_new_tokens=4), Collector()))
    assert scheduler.waiting == 2
    # nothing has left yet: the drain rate is unknown, Retry-After its conservative default
    assert refused.value.retry_after_s == UNKNOWN_RETRY_AFTER_S
    assert f"retry in {UNKNOWN_RETRY_AFTER_S} s" in str(refused.value)


def test_a_cancelled_request_stops_and_reports_what_it_decoded(loaded, prompt):
    scheduler = Scheduler(queue_size=4, max_active=2)
    collector = Collector()
    generation = decoder(loaded).stream(prompt, max_new_tokens=200)
    request = job(generation, collector)
    scheduler.submit(request)
    scheduler.start()
    try:
        kind, _first = collector.events.get(timeout=30)
        assert kind == "token"
        request.cancel("client disconnected")
        _tokens, kind, reason = collector.drain()
    finally:
        scheduler.stop()
    assert kind == "cancelled" and reason == "client disconnected"
    assert generation.result is not None
    assert generation.result.stop_reason == "cancelled"
    assert len(generation.result.token_ids) < 200


def test_a_request_past_its_deadline_is_cut_with_timeout(loaded, prompt):
    scheduler = Scheduler(queue_size=4, max_active=1)
    collector = Collector()
    scheduler.submit(
        job(decoder(loaded).stream(prompt, max_new_tokens=50), collector, deadline_s=-1)
    )
    scheduler.start()
    try:
        tokens, kind, reason = collector.drain()
    finally:
        scheduler.stop()
    assert (tokens, kind, reason) == ([], "cancelled", "timeout")


def test_a_failing_request_is_reported_and_the_loop_goes_on(loaded, prompt):
    class Broken(PromptLookupDrafter):
        def propose(self, request):
            raise RuntimeError("boom")

    scheduler = Scheduler(queue_size=4, max_active=2)
    broken, healthy = Collector(), Collector()
    failing = SpeculativeDecoder(loaded, drafter=Broken(), policy=FixedK(3))
    scheduler.submit(job(failing.stream(prompt, max_new_tokens=8), broken))
    scheduler.submit(job(decoder(loaded).stream(prompt, max_new_tokens=8), healthy))
    scheduler.start()
    try:
        _, kind, error = broken.drain()
        tokens, healthy_kind, _ = healthy.drain()
    finally:
        scheduler.stop()
    assert kind == "error" and "boom" in str(error)
    assert healthy_kind == "done"
    assert tokens == decoder(loaded).generate(prompt, max_new_tokens=8).token_ids


def test_a_job_without_a_decoding_is_refused(loaded, prompt):
    class NotAGeneration:
        decoding = None

    scheduler = Scheduler(queue_size=4, max_active=2)
    with pytest.raises(SpecOpsError, match=r"SpeculativeDecoder\.stream"):
        scheduler.submit(job(NotAGeneration(), Collector()))  # type: ignore[arg-type]


def test_passes_are_reported_with_their_size_and_tokens(loaded, prompt):
    passes: list[tuple[int, int]] = []
    scheduler = Scheduler(
        queue_size=8, max_active=4, on_pass=lambda size, tokens: passes.append((size, tokens))
    )
    collectors = [Collector() for _ in range(4)]
    for collector in collectors:
        scheduler.submit(job(decoder(loaded).stream(prompt, max_new_tokens=12), collector))
    scheduler.start()
    try:
        for collector in collectors:
            assert collector.drain()[1] == "done"
    finally:
        scheduler.stop()
    assert max(size for size, _ in passes) == 4  # all four rode together
    assert all(tokens >= size for size, tokens in passes)


def test_stop_cancels_what_is_left(loaded, prompt):
    scheduler = Scheduler(queue_size=4, max_active=1)
    collectors = [Collector(), Collector()]
    for collector in collectors:
        scheduler.submit(job(decoder(loaded).stream(prompt, max_new_tokens=200), collector))
    scheduler.start()
    collectors[0].events.get(timeout=30)
    scheduler.stop()
    assert collectors[1].drain()[1] == "cancelled"


def test_workers_never_hold_more_requests_than_max_active(loaded, prompt):
    scheduler = Scheduler(queue_size=8, max_active=1, workers=2)
    assert scheduler.workers == 1
    collectors = [Collector() for _ in range(3)]
    for collector in collectors:
        scheduler.submit(job(decoder(loaded).stream(prompt, max_new_tokens=20), collector))
    scheduler.start()
    try:
        collectors[0].events.get(timeout=30)
        assert scheduler.running == 1 and scheduler.waiting == 2
        for collector in collectors:
            assert collector.drain()[1] == "done"
    finally:
        scheduler.stop()


def test_a_failing_batch_step_fails_its_requests_and_the_loop_goes_on(loaded, prompt, monkeypatch):
    from serving.engine.batch.batch import Batch

    real_step = Batch.step
    calls = {"n": 0}

    def step_once_broken(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("step broke")
        return real_step(self)

    monkeypatch.setattr(Batch, "step", step_once_broken)
    scheduler = Scheduler(queue_size=4, max_active=2)
    first = Collector()
    scheduler.submit(job(decoder(loaded).stream(prompt, max_new_tokens=8), first))
    scheduler.start()
    try:
        _, kind, error = first.drain()
        assert kind == "error" and "step broke" in str(error)
        later = Collector()
        scheduler.submit(job(decoder(loaded).stream(prompt, max_new_tokens=8), later))
        tokens, kind, _ = later.drain()
    finally:
        scheduler.stop()
    assert kind == "done"
    assert tokens == decoder(loaded).generate(prompt, max_new_tokens=8).token_ids
