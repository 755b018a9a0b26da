"""Closed-loop clients against closed forms: one client cycles every service + think
seconds; N staggered clients on an unsaturated server each do the same; N clients on a
saturated unbatched server obey Little's law. Traces replay per-request lengths exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from serving.errors import BadInputError
from tasks.simulate.config import parse_scenario
from tasks.simulate.model import simulate
from tasks.simulate.report import summarise

PASS_S = 0.1  # a one-token pass


def _scenario(arrivals: dict[str, Any], **changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "targets": [
            {
                "name": "t",
                "one_token_pass_s": PASS_S,
                "batch_curve": [[1, 1.0], [8, 2.0]],
                "max_batch": 8,
                "max_tokens_per_pass": 8,
            }
        ],
        "drafters": [{"name": "none", "k": 0}],
        "arrivals": {"kind": "closed", "output_tokens": 1, **arrivals},
        "duration_s": 100.0,
        "seed": 3,
    }
    raw.update(changes)
    return raw


def test_one_client_cycles_every_service_plus_think() -> None:
    # k = 4 drafts all kept: one round of 5 rows; distributed over a 20 ms link
    drafter = {
        "name": "d",
        "k": 4,
        "acceptance_by_position": [1.0] * 4,
        "draft_s_per_token": 0.01,
    }
    raw = _scenario(
        {"clients": 1, "think_s": 0.4, "output_tokens": 5},
        drafters=[drafter],
        link={"rtt_s": 0.02},
    )
    log = simulate(parse_scenario(raw))
    service = 4 * 0.01 + 0.02 + PASS_S * (1 + 4 / 7)  # drafting, link, pass over 5 rows
    latency = np.array([r.finish_s - r.arrival_s for r in log.requests])
    assert latency == pytest.approx(service)
    report = summarise(log)
    expected = 1 / (service + 0.4)  # requests per second
    assert report["requests"] / 100.0 == pytest.approx(expected, rel=0.01)
    assert report["throughput_tokens_per_s"] == pytest.approx(5 * expected, rel=0.01)
    gaps = np.diff([r.arrival_s for r in log.requests])
    assert gaps == pytest.approx(service + 0.4)  # the next request after the answer + think


def test_staggered_clients_on_an_unsaturated_server_do_not_wait() -> None:
    # 5 clients 0.2 s apart, each pass 0.1 s: never two in a pass, nobody queues
    raw = _scenario({"clients": 5, "think_s": 0.9, "ramp_s": 1.0})
    log = simulate(parse_scenario(raw))
    report = summarise(log)
    assert set(log.passes.requests) == {1}
    assert report["queue_wait_s"]["p99"] == pytest.approx(0.0, abs=1e-9)
    assert report["latency_s"]["mean"] == pytest.approx(PASS_S)
    assert report["requests"] / 100.0 == pytest.approx(5 / (PASS_S + 0.9), rel=0.01)
    assert {r.client for r in log.requests} == set(range(5))


def test_saturated_unbatched_server_obeys_littles_law() -> None:
    # 10 clients, no think time, one request per pass: the server is always busy, so
    # X = 1 / 0.1 s and every request waits for the 9 others: R = N / X = 1 s
    raw = _scenario({"clients": 10}, duration_s=200.0)
    raw["targets"][0]["max_batch"] = 1
    report = summarise(simulate(parse_scenario(raw)))
    assert report["throughput_tokens_per_s"] == pytest.approx(1 / PASS_S, rel=0.01)
    assert report["latency_s"]["p50"] == pytest.approx(10 * PASS_S, rel=0.01)
    assert report["busy"] == pytest.approx(1.0, rel=0.01)


def test_requests_per_client_and_max_requests_end_the_run_early() -> None:
    raw = _scenario({"clients": 4, "requests_per_client": 3, "think_s": 0.5})
    log = simulate(parse_scenario(raw))
    assert len(log.requests) == 12 and all(not np.isnan(r.finish_s) for r in log.requests)
    assert [sum(r.client == c for r in log.requests) for c in range(4)] == [3, 3, 3, 3]
    assert log.end_s < 5.0  # stopped once the last answer was back, not at duration_s
    capped = simulate(parse_scenario(_scenario({"clients": 4, "max_requests": 5})))
    assert len(capped.requests) == 5


def test_each_client_keeps_one_drafter_and_runs_are_deterministic() -> None:
    drafters = [
        {"name": "a", "k": 2, "acceptance_by_position": [0.5, 0.5], "share": 1.0},
        {"name": "b", "k": 0, "share": 1.0},
    ]
    raw = _scenario(
        {"clients": 6, "think_s": 0.2, "output_tokens": [4, 8]},
        drafters=drafters,
        duration_s=30.0,
    )
    first, again = simulate(parse_scenario(raw)), simulate(parse_scenario(raw))
    by_client: dict[int, set[int]] = {}
    for request in first.requests:
        by_client.setdefault(request.client, set()).add(request.drafter)
    assert all(len(used) == 1 for used in by_client.values())
    assert {r.output_tokens for r in first.requests} == {4, 8}
    assert [r.finish_s for r in first.requests] == [r.finish_s for r in again.requests]


def test_a_trace_replays_its_per_request_lengths() -> None:
    raw = _scenario({})
    raw["arrivals"] = {
        "kind": "trace",
        "timestamps": [0.0, 1.0, 2.0],
        "prompt_tokens": [5, 0, 7],
        "output_tokens": [1, 3, 2],
        "lengths": "per_request",
    }
    log = simulate(parse_scenario(raw))
    assert [(r.prompt_tokens, r.output_tokens) for r in log.requests] == [(5, 1), (0, 3), (7, 2)]
    assert [r.produced for r in log.requests] == [1, 3, 2]


def _refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(BadInputError) as caught:
        parse_scenario(raw)
    return str(caught.value)


def test_closed_and_trace_refusals_name_their_field() -> None:
    assert "arrivals.closed.clients" in _refusal(_scenario({"clients": 0}))
    assert "arrivals.closed.think_s" in _refusal(_scenario({"clients": 2, "think_s": -1}))
    assert "arrivals.closed.requests_per_client" in _refusal(
        _scenario({"clients": 2, "requests_per_client": 0})
    )
    assert "arrivals.closed.rate_per_s" in _refusal(_scenario({"clients": 2, "rate_per_s": 1}))
    assert "arrivals.closed.clients" in _refusal(_scenario({}))  # missing
    trace = {
        "kind": "trace",
        "timestamps": [0.0, 1.0],
        "output_tokens": [1, 2, 3],
        "lengths": "per_request",
    }
    message = _refusal({**_scenario({}), "arrivals": trace})
    assert "arrivals.trace" in message and "output_tokens: 3 entries for 2 timestamps" in message
    trace["lengths"] = "in_order"
    assert "arrivals.trace.lengths" in _refusal({**_scenario({}), "arrivals": trace})
