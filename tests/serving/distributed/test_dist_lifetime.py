"""Sessions end: idle expiry frees a vanished client's state; a cancelled stream and a
verify past its deadline close the session they left in an unknown state; a step
cancelled before its pass leaves the session as it was."""

from __future__ import annotations

import time

import grpc
import pytest

from serving.distributed import scheduler as scheduler_module
from serving.distributed.client import RemoteError, TargetClient
from serving.distributed.server import TargetLimits, TargetService, serve_target
from serving.distributed.sessions import ClientBlock, Session, SessionTable
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import Drafter
from serving.engine.policy import FixedK
from serving.errors import BadInputError


@pytest.fixture
def server(loaded):
    service = TargetService(
        loaded, eos_token_ids=[], limits=TargetLimits(idle_timeout_s=0.3, max_block=8)
    )
    running = serve_target(service)
    yield running
    running.stop()


def _client(server, **kwargs) -> TargetClient:
    return TargetClient(f"127.0.0.1:{server.port}", **kwargs)


def _wait_until(condition, timeout_s=5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


class ManualClock:
    """Idle time that passes only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_idle_session_expires_and_its_state_is_freed(prompt, server):
    table = server.service.table
    clock = table.clock = ManualClock()  # before any session: idle time is the test's
    with _client(server) as client:
        session = client.start(prompt, max_new_tokens=8).session_id
        clock.now = 0.25  # however slow the machine, the session is still fresh
        client.verify(session, [5, 17])  # used at 0.25: idle from there
        assert len(table) == 1
        live = table.get(session)
        assert _wait_until(lambda: live.busy == 0)  # the scheduler has settled the step
        assert table.idle(now=0.5) == []  # 0.25 s idle, under the 0.3 s timeout
        assert [s.id for s in table.idle(now=0.625)] == [session]  # 0.375 s: past it
        clock.now = 0.625
        # The scheduler expires idle sessions between passes (every tick when idle).
        assert _wait_until(lambda: len(table) == 0, 30.0)
        with pytest.raises(RemoteError) as caught:
            client.verify(session, [])
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        assert "idle for more than 0.3 s" in caught.value.details


def test_a_cancelled_stream_closes_its_session(prompt, server):
    with _client(server) as client:
        session = client.start(prompt, max_new_tokens=200, server_drafter="pld").session_id
        stream = client.generate(session)
        next(stream)
        stream.close()  # the client walks away mid-answer
        assert _wait_until(lambda: len(server.service.table) == 0, 3.0)
        with pytest.raises(RemoteError) as caught:
            client.finalize(session)
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        assert "cancelled" in caught.value.details


def _slow_passes(monkeypatch) -> None:
    """Every target pass takes 0.6 s longer (until the test puts the real one back)."""
    real = scheduler_module.verify_drafted

    def slow(*args, **kwargs):
        time.sleep(0.6)
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduler_module, "verify_drafted", slow)


def test_a_verify_past_its_deadline_closes_the_session(prompt, server, monkeypatch):
    with _client(server) as client:
        session = client.start(prompt, max_new_tokens=8).session_id
        _slow_passes(monkeypatch)
        with _client(server, timeout_s=0.2) as hasty, pytest.raises(RemoteError) as caught:
            hasty.verify(session, [5])
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        monkeypatch.undo()
        assert _wait_until(lambda: len(server.service.table) == 0, 3.0)
        with pytest.raises(RemoteError) as gone:
            client.verify(session, [])
        assert gone.value.code == grpc.StatusCode.NOT_FOUND
        assert "cancelled after its step ran" in gone.value.details


def test_a_batch_past_its_deadline_closes_every_session_it_moved(prompt, server, monkeypatch):
    with _client(server) as client:
        sessions = [client.start(prompt, max_new_tokens=8).session_id for _ in range(2)]
        _slow_passes(monkeypatch)
        with _client(server, timeout_s=0.2) as hasty, pytest.raises(RemoteError) as caught:
            hasty.verify_batch([(s, [5]) for s in sessions])
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        monkeypatch.undo()
        assert _wait_until(lambda: len(server.service.table) == 0, 3.0)
        for session in sessions:
            with pytest.raises(RemoteError) as gone:
                client.verify(session, [])
            assert gone.value.code == grpc.StatusCode.NOT_FOUND
            assert "after its step ran" in gone.value.details  # closed, not expired


def test_a_step_cancelled_before_its_pass_changes_nothing(loaded, prompt):
    table = SessionTable(limit=2, idle_timeout_s=60)
    sched = scheduler_module.Scheduler(
        loaded,
        table,
        limits=scheduler_module.BatchLimits(),
        cost=scheduler_module.PassCost(),
    )  # not started: this test runs its rounds by hand
    decoder = SpeculativeDecoder(loaded, drafter=ClientBlock(), policy=FixedK(8))
    session = Session("s", decoder.begin(prompt, max_new_tokens=8), fused=False)
    sched._work([scheduler_module._Job("start", build=lambda: session)])
    before = list(session.decoding.tokens)
    future = sched.step(session, [5, 17])
    assert future.cancel()
    jobs = list(sched._jobs)
    sched._jobs.clear()
    assert sched._work(jobs) == []
    assert session.decoding.tokens == before and session.busy == 0
    # The next step runs as if the cancelled one had never been sent.
    done_future = sched.step(session, [])
    jobs = list(sched._jobs)
    sched._jobs.clear()
    sched._work(jobs)
    assert (
        done_future.result().new_tokens
        == SpeculativeDecoder(loaded).generate(prompt, max_new_tokens=1).token_ids
    )


class _HiddenReader(Drafter):
    needs_target_hidden = True

    def begin(self, prompt):  # pragma: no cover - never reached
        pass

    def propose(self, request):  # pragma: no cover
        raise AssertionError

    def commit(self, feedback):  # pragma: no cover
        pass


def test_a_client_refuses_a_drafter_that_reads_the_targets_hidden_states(prompt, server):
    from serving.distributed.client import run_distributed

    with _client(server) as client, pytest.raises(BadInputError, match="run it fused"):
        run_distributed(client, prompt, drafter=_HiddenReader(), policy=FixedK(2), max_new_tokens=4)
