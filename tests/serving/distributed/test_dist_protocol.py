"""The gRPC protocol on loopback with the tiny target: every mode reproduces plain
decoding, a batch verify equals single verifies, and bad requests get clear statuses."""

from __future__ import annotations

import grpc
import pytest

from serving.distributed.client import RemoteError, TargetClient, run_distributed, run_fused
from serving.distributed.server import TargetLimits, TargetService, serve_target
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.engine.sampling import SamplingParams

NEW = 40
OTHER_PROMPTS = [[1, 9, 9, 4, 7, 9, 9, 4, 7, 9], [1, 30, 31, 32, 30, 31, 32, 30, 31]]


@pytest.fixture(scope="module")
def running(loaded):
    service = TargetService(
        loaded, eos_token_ids=[], limits=TargetLimits(max_sessions=6, max_block=8)
    )
    server = serve_target(service)
    yield server
    server.stop()


@pytest.fixture
def client(running):
    with TargetClient(f"127.0.0.1:{running.port}", timeout_s=30) as made:
        yield made


def _plain(loaded, prompt, new=NEW, sampling=None):
    return SpeculativeDecoder(loaded).generate(prompt, max_new_tokens=new, sampling=sampling)


def test_distributed_greedy_equals_plain(loaded, prompt, client):
    expected = _plain(loaded, prompt).token_ids
    result = run_distributed(
        client, prompt, drafter=PromptLookupDrafter(), policy=FixedK(4), max_new_tokens=NEW
    )
    assert result.token_ids == expected
    assert result.stop_reason == "length"
    assert result.draft_tokens > 0  # the drafter did draft: a real check of the path
    assert result.round_trips == len(result.steps) + 2


def test_model_drafter_on_the_client_equals_plain(loaded, prompt, client):
    expected = _plain(loaded, prompt).token_ids
    drafter = build_drafter("layers:1", loaded)
    result = run_distributed(client, prompt, drafter=drafter, policy=FixedK(3), max_new_tokens=NEW)
    assert result.token_ids == expected
    assert result.accepted_tokens > 0


def test_fused_and_plain_over_the_link_equal_plain(loaded, prompt, client):
    expected = _plain(loaded, prompt).token_ids
    fused = run_fused(client, prompt, server_drafter="pld", k=4, max_new_tokens=NEW)
    assert fused.token_ids == expected
    assert fused.draft_tokens > 0
    assert run_fused(client, prompt, server_drafter="none", max_new_tokens=NEW).token_ids == (
        expected
    )
    over_link = run_distributed(client, prompt, drafter=None, policy=None, max_new_tokens=NEW)
    assert over_link.token_ids == expected


def test_sampling_matches_the_engine_with_the_same_seed(loaded, prompt, client):
    """The server samples with the request's seeded sampler and verifies the client's
    blocks as the engine verifies the same drafter's: the same draws, the same output."""
    sampling = SamplingParams(temperature=0.9, top_k=20, seed=7)
    engine = SpeculativeDecoder(loaded, drafter=PromptLookupDrafter(), policy=FixedK(4))
    expected = engine.generate(prompt, max_new_tokens=NEW, sampling=sampling).token_ids
    result = run_distributed(
        client,
        prompt,
        drafter=PromptLookupDrafter(),
        policy=FixedK(4),
        max_new_tokens=NEW,
        sampling=sampling,
    )
    assert result.token_ids == expected
    assert expected != _plain(loaded, prompt).token_ids  # it did sample


def _drive(client, prompts, *, batched: bool):
    """Decode ``prompts`` together, step by step, with prompt-lookup blocks of 3."""
    sessions = [client.start(p, max_new_tokens=24).session_id for p in prompts]
    drafters = [PromptLookupDrafter() for _ in prompts]
    tokens = [list(p) for p in prompts]
    for drafter, p in zip(drafters, prompts, strict=True):
        drafter.begin(list(p))
    from serving.engine.drafters.base import DraftRequest, StepFeedback
    from serving.engine.sampling import make_sampler

    sampler = make_sampler(SamplingParams())
    replies: list[list] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    while active:
        blocks = {
            i: drafters[i].propose(DraftRequest(tokens[i], 3, sampler)).tokens.tolist()
            for i in active
        }
        if batched:
            steps = client.verify_batch([(sessions[i], blocks[i]) for i in active])
        else:
            steps = [client.verify(sessions[i], blocks[i]) for i in active]
        riding = list(active)
        for i, step in zip(riding, steps, strict=True):
            new = list(step.new_token_ids)
            drafters[i].commit(StepFeedback(len(blocks[i]), step.accepted, new, tokens[i] + new))
            tokens[i].extend(new)
            replies[i].append((step.proposed, step.accepted, tuple(step.emitted_token_ids)))
            if batched:
                assert step.pass_sessions == len(riding)  # one pass for the whole call
            if step.finished:
                active.remove(i)
    for session in sessions:
        client.finalize(session)
    return replies


def test_batch_verify_equals_single_verifies(loaded, prompt, client):
    prompts = [prompt, *OTHER_PROMPTS]
    batched = _drive(client, prompts, batched=True)
    single = _drive(client, prompts, batched=False)
    assert batched == single
    for p, steps in zip(prompts, batched, strict=True):
        assert [t for _, _, e in steps for t in e] == _plain(loaded, p, 24).token_ids


def _code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(RemoteError) as caught:
        call()
    return caught.value.code, caught.value.details


def test_bad_requests_get_statuses_and_the_server_keeps_serving(loaded, prompt, client):
    session = client.start(prompt, max_new_tokens=4).session_id
    code, details = _code(lambda: client.verify("no-such-session", []))
    assert code == grpc.StatusCode.NOT_FOUND and "no-such-session" in details
    code, details = _code(lambda: client.verify(session, [5] * 9))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit of 8" in details
    code, details = _code(lambda: client.verify(session, [5, 96]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "[96]" in details
    assert "vocabulary" in details
    code, details = _code(lambda: client.verify_batch([(session, []), (session, [])]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "twice" in details
    code, details = _code(lambda: client.start([1, 500], max_new_tokens=4))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "500" in details
    code, details = _code(lambda: client.start(prompt, max_new_tokens=0))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_new_tokens" in details
    code, details = _code(lambda: client.start(prompt, max_new_tokens=4, server_drafter="nope"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "nope" in details
    fused = client.start(prompt, max_new_tokens=4, server_drafter="pld").session_id
    code, details = _code(lambda: client.verify(fused, [5]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "fused" in details
    client.finalize(fused)
    # Decode the session to its end; one more verify is refused.
    while not client.verify(session, []).finished:
        pass
    code, details = _code(lambda: client.verify(session, []))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "Finalize" in details
    assert list(client.finalize(session).output_token_ids) == _plain(loaded, prompt, 4).token_ids
    # ...and the server still serves.
    result = run_distributed(client, prompt, drafter=None, policy=None, max_new_tokens=6)
    assert result.token_ids == _plain(loaded, prompt, 6).token_ids


def test_session_limit(prompt, running, client):
    limit = running.service.limits.max_sessions
    held = [client.start(prompt, max_new_tokens=4).session_id for _ in range(limit)]
    try:
        code, details = _code(lambda: client.start(prompt, max_new_tokens=4))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and str(limit) in details
    finally:
        for session in held:
            client.finalize(session)
    client.finalize(client.start(prompt, max_new_tokens=4).session_id)  # room again
