"""The simulator's model against queueing theory and its own rules: an unbatched server
with Poisson arrivals is an M/D/1 queue; routers choose as documented; a batching window
groups what arrives within it; acceptance follows the per-position probabilities."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tasks.simulate.config import parse_scenario
from tasks.simulate.model import Acceptance, Router, Uniforms, simulate


def _scenario(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "targets": [
            {
                "name": "t",
                "one_token_pass_s": 0.1,
                "batch_curve": [[1, 1.0], [64, 1.0]],
                "max_batch": 1,
                "max_tokens_per_pass": 1,
            }
        ],
        "drafters": [{"name": "none", "k": 0}],
        "arrivals": {"kind": "poisson", "rate_per_s": 6.0, "output_tokens": 1},
        "batching": {"window_s": 0.0},
        "duration_s": 10_000.0,
        "seed": 7,
    }
    raw.update(changes)
    return raw


def test_unbatched_server_is_md1_pollaczek_khinchine() -> None:
    log = simulate(parse_scenario(_scenario()))
    rho, service_s = 6.0 * 0.1, 0.1
    expected = rho * service_s / (2 * (1 - rho))  # 0.075 s
    waits = np.array([r.queue_wait_s for r in log.requests])
    assert len(waits) > 50_000
    assert waits.mean() == pytest.approx(expected, rel=0.1)
    assert all(n == 1 for n in log.passes.requests)


def test_same_seed_same_run_and_another_seed_differs() -> None:
    raw = _scenario(duration_s=200.0)
    first, again = simulate(parse_scenario(raw)), simulate(parse_scenario(raw))
    assert [r.finish_s for r in first.requests] == [r.finish_s for r in again.requests]
    other = simulate(parse_scenario({**raw, "seed": 8}))
    assert [r.arrival_s for r in other.requests] != [r.arrival_s for r in first.requests]


def test_round_robin_cycles() -> None:
    router = Router("round_robin", [0.1, 0.1, 0.1], np.random.default_rng(0))
    assert [router.pick([9, 0, 0]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_jsq2_takes_the_shorter_of_two() -> None:
    router = Router("jsq2", [0.1, 0.1, 0.1], np.random.default_rng(0))
    picks = np.array([router.pick([0, 5, 10]) for _ in range(6000)])
    assert (picks == 2).sum() == 0  # it loses to either other one
    assert (picks == 0).mean() == pytest.approx(2 / 3, abs=0.03)  # whenever it is drawn
    two = Router("jsq2", [0.1, 0.1], np.random.default_rng(1))
    assert {two.pick([4, 1]) for _ in range(50)} == {1}


def test_weighted_jsq2_weighs_by_speed() -> None:
    loads = [3, 1]  # the fast device has more sessions, but is ten times faster
    weighted = Router("weighted_jsq2", [0.01, 0.1], np.random.default_rng(0))
    plain = Router("jsq2", [0.01, 0.1], np.random.default_rng(0))
    assert {weighted.pick(loads) for _ in range(50)} == {0}
    assert {plain.pick(loads) for _ in range(50)} == {1}


def _trace_run(window_s: float, max_batch: int) -> tuple[list[float], list[int]]:
    target = {
        "name": "t",
        "one_token_pass_s": 0.1,
        "batch_curve": [[1, 1.0], [8, 2.0]],
        "max_batch": max_batch,
        "max_tokens_per_pass": 8,
    }
    raw = _scenario(
        targets=[target],
        arrivals={"kind": "trace", "timestamps": [0.0, 0.01, 0.02, 0.5], "output_tokens": 1},
        batching={"window_s": window_s},
        duration_s=1.0,
    )
    log = simulate(parse_scenario(raw))
    return log.passes.start_s, log.passes.requests


def test_batching_window_groups_arrivals_into_one_pass() -> None:
    starts, sizes = _trace_run(window_s=0.05, max_batch=8)
    assert sizes == [3, 1]
    assert starts == pytest.approx([0.05, 0.55])


def test_no_window_passes_what_is_there_and_a_full_batch_goes_early() -> None:
    starts, sizes = _trace_run(window_s=0.0, max_batch=8)
    assert sizes == [1, 2, 1]  # the two that came during the first pass ride together
    starts, sizes = _trace_run(window_s=0.05, max_batch=2)
    assert sizes[0] == 2 and starts[0] == pytest.approx(0.01)


def test_pass_cost_follows_the_curve_and_fused_drafting_adds_to_it() -> None:
    target = {
        "name": "t",
        "one_token_pass_s": 0.1,
        "batch_curve": [[1, 1.0], [5, 3.0]],
        "max_batch": 1,
        "max_tokens_per_pass": 5,
    }
    drafter = {
        "name": "d",
        "k": 4,
        "acceptance_by_position": [0, 0, 0, 0],
        "draft_s_per_token": 0.01,
    }
    common = {
        "targets": [target],
        "drafters": [drafter],
        "arrivals": {"kind": "trace", "timestamps": [0.0], "output_tokens": 5},
        "link": {"rtt_s": 0.2},
        "duration_s": 10.0,
    }
    distributed = simulate(parse_scenario(_scenario(**common, mode="distributed")))
    fused = simulate(parse_scenario(_scenario(**common, mode="fused")))
    # nothing accepted: 5 rounds; blocks of 5, 4, 3, 2, 1 rows (k capped by what is left)
    assert distributed.passes.rows == [5, 4, 3, 2, 1]
    curve = [3.0, 2.5, 2.0, 1.5, 1.0]
    assert distributed.passes.duration_s == pytest.approx([0.1 * c for c in curve])
    drafting = [0.04, 0.03, 0.02, 0.01, 0.0]
    assert fused.passes.duration_s == pytest.approx(
        [0.1 * c + d for c, d in zip(curve, drafting, strict=True)]
    )
    # distributed: per round half an RTT each way plus drafting on the client
    passes = sum(0.1 * c for c in curve)
    assert distributed.requests[0].finish_s == pytest.approx(passes + 5 * 0.2 + sum(drafting))
    assert fused.requests[0].finish_s == pytest.approx(passes + sum(drafting))


def test_accepted_length_follows_acceptance_by_position() -> None:
    probabilities = [0.9, 0.5, 0.2]
    acceptance = Acceptance(probabilities, Uniforms(np.random.default_rng(3)))
    draws = np.array([acceptance.sample(3) for _ in range(40_000)])
    expected = [0.1, 0.9 * 0.5, 0.9 * 0.5 * 0.8, 0.9 * 0.5 * 0.2]  # P(accepted = 0..3)
    observed = np.bincount(draws, minlength=4) / len(draws)
    assert observed == pytest.approx(expected, abs=0.01)
    capped = Acceptance(probabilities, Uniforms(np.random.default_rng(0)))
    assert max(capped.sample(1) for _ in range(200)) == 1  # never more than k


@pytest.mark.parametrize(
    ("mixed", "sizes", "rows"), [(False, [1, 1, 2], [0, 0, 2]), (True, [2, 2], [0, 2])]
)
def test_prefill_alone_or_mixed_into_a_pass(mixed: bool, sizes: list[int], rows: list[int]):
    target = {
        "name": "t",
        "one_token_pass_s": 0.1,
        "batch_curve": [[1, 1.0], [8, 2.0]],
        "prefill_s_per_token": 0.01,
    }
    raw = _scenario(
        targets=[target],
        arrivals={"kind": "trace", "timestamps": [0.0, 0.0], "prompt_tokens": 10},
        batching={"window_s": 0.0, "mixed_prefill": mixed},
        duration_s=1.0,
    )
    log = simulate(parse_scenario(raw))
    assert log.passes.requests == sizes
    assert log.passes.rows == rows
    assert sum(log.passes.prefill_tokens) == 20
