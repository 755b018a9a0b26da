"""What calibration needs from the model: the target server's batching rule, draft blocks
of measured lengths, a closed-loop run replayed request by request; and the calibration's
own scenario for a measured point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serving.errors import BadInputError
from tasks.simulate.acceptance import estimate_steps
from tasks.simulate.calibrate import (
    CalibrationSettings,
    point_scenario,
    predict,
    prefill_s_per_token,
)
from tasks.simulate.config import parse_scenario
from tasks.simulate.model import simulate

ROOT = Path(__file__).resolve().parents[3]
PASS_S = 0.1


def _scenario(**changes: Any) -> dict[str, Any]:
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
        # the second client starts half a pass after the first
        "arrivals": {
            "kind": "closed",
            "clients": 2,
            "output_tokens": 20,
            "max_requests": 2,
            "ramp_s": PASS_S,
        },
        "link": {"rtt_s": 0.004},
        "duration_s": 100.0,
        "seed": 1,
    }
    raw.update(changes)
    return raw


def test_waiting_for_sessions_keeps_two_sessions_in_one_pass() -> None:
    """Each session's next block comes back 4 ms after its verdict: waiting up to 10 ms
    from when the server is free, both ride every pass; with no window (or a window
    counted from the oldest block) they drift apart and pass alone."""
    together = simulate(
        parse_scenario(_scenario(batching={"window_s": 0.01, "wait_for": "sessions"}))
    )
    apart = simulate(parse_scenario(_scenario(batching={"window_s": 0.0})))

    def mean_batch(log) -> float:
        sizes = [b for b, rows in zip(log.passes.requests, log.passes.rows, strict=True) if rows]
        return sum(sizes) / len(sizes)

    assert mean_batch(together) > 1.9
    assert mean_batch(apart) == 1.0
    assert max(r.finish_s for r in together.requests) < max(r.finish_s for r in apart.requests)


@pytest.mark.parametrize(("shares", "tokens_per_round"), [([1, 0, 0], 1), ([0, 0, 1], 3)])
def test_block_shares_set_the_draft_length(shares: list[int], tokens_per_round: int) -> None:
    drafter = {"name": "d", "k": 2, "acceptance_by_position": [1.0, 1.0], "block_shares": shares}
    raw = _scenario(
        drafters=[drafter],
        arrivals={"kind": "closed", "clients": 1, "output_tokens": 31, "max_requests": 1},
    )
    (request,) = simulate(parse_scenario(raw)).requests
    assert request.rounds == -(-31 // tokens_per_round)


def test_block_shares_are_checked() -> None:
    drafter = {"name": "d", "k": 1, "acceptance_by_position": [1.0], "block_shares": [0, 0, 1]}
    with pytest.raises(BadInputError, match="block_shares"):
        parse_scenario(_scenario(drafters=[drafter]))


def test_closed_clients_replay_lengths_request_by_request() -> None:
    arrivals = {
        "kind": "closed",
        "clients": 2,
        "lengths": "per_request",
        "prompt_tokens": [5, 6, 7],
        "output_tokens": [3, 4, 5],
    }
    log = simulate(parse_scenario(_scenario(arrivals=arrivals)))
    assert [(r.prompt_tokens, r.output_tokens) for r in log.requests] == [(5, 3), (6, 4), (7, 5)]
    arrivals["output_tokens"] = [3, 4]
    with pytest.raises(BadInputError, match="equally long"):
        parse_scenario(_scenario(arrivals=arrivals))


def test_estimate_counts_block_lengths() -> None:
    estimate = estimate_steps([(0, 0), (4, 1), (4, 4), (2, 2)], name="pld")
    assert estimate.block_shares == [0.25, 0.0, 0.25, 0.0, 0.5]
    section = estimate.drafter_section(k=3)  # blocks of 4 counted as the cap, 3
    assert section["block_shares"] == [0.25, 0.0, 0.25, 0.5]


def test_a_measured_point_becomes_a_scenario() -> None:
    profile = ROOT / "measurements" / "profile-batch.json"
    point = {
        "mode": "distributed",
        "rtt_ms": 5.0,
        "sessions": 2,
        "per_request": [
            {"prompt": 1, "prompt_tokens": 120, "output_tokens": 16, "draft_s": 0.002,
             "steps": [[4, 4], [0, 0], [4, 1], [4, 4]]},
            {"prompt": 0, "prompt_tokens": 100, "output_tokens": 12, "draft_s": 0.001,
             "steps": [[4, 2], [4, 0], [2, 2], [0, 0]]},
        ],
    }  # fmt: skip
    prefill = prefill_s_per_token(profile)
    raw = point_scenario(point, CalibrationSettings(profile=profile), k=4, prefill_s=prefill)
    assert raw["arrivals"]["prompt_tokens"] == [99, 119]  # in send order, cache-held tokens
    assert raw["arrivals"]["output_tokens"] == [12, 16]
    assert raw["link"]["rtt_s"] == pytest.approx(0.005)
    assert raw["drafters"][0]["draft_s_per_token"] == pytest.approx(0.003 / 22)
    predicted = predict(raw)
    assert predicted["tokens_per_s"] > 0 and predicted["latency_p50_s"] > 0
    point["per_request"][0].pop("prompt_tokens")
    with pytest.raises(BadInputError, match="prompt_tokens"):
        point_scenario(point, CalibrationSettings(profile=profile), k=4, prefill_s=prefill)


def test_a_profile_prices_passes_by_rows_and_sequences() -> None:
    raw = _scenario()
    raw["targets"] = [{"name": "cpu", "profile": str(ROOT / "measurements" / "profile-batch.json")}]
    (device,) = parse_scenario(raw).targets
    grid = device.pass_grid()
    one = device.pass_s
    assert grid[1][8] / one == pytest.approx(1.357)  # one sequence's 8 rows
    assert grid[8][8] / one == pytest.approx(1.604)  # eight sequences' 8 rows
    assert grid[6][8] / one == pytest.approx((1.43 + 1.604) / 2)  # between 4 and 8
    assert grid[1][5] / one == pytest.approx(1.0 + 0.357 / 4)  # between 4 and 8 rows
    assert grid[3][0] == 0.0
