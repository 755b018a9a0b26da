"""Rolling acceptance per (workload, hardware) and the retrain signal."""

from __future__ import annotations

import pytest

from serving.records.schema import RequestRecord, parse_record
from tasks.data.acceptance import rolling_acceptance
from tests.tasks.data.test_validate import make_record


def _row(
    index: int, drafted: int, accepted: int, *, workload: str = "grounded", hardware: str = "cpu"
) -> RequestRecord:
    return parse_record(
        make_record(
            index,
            id=f"req-{index:03d}",
            timestamp=1_750_000_000.0 + index,
            workload=workload,
            hardware=hardware,
            draft_tokens=drafted,
            accepted_tokens=accepted,
        )
    )


def test_window_pools_tokens_over_the_last_requests():
    rows = [_row(0, 10, 10), _row(1, 10, 0), _row(2, 2, 2), _row(3, 8, 2)]
    (group,) = rolling_acceptance(rows, window=3, threshold=0.5)
    # The last three requests: (0 + 2 + 2) / (10 + 2 + 8), pooled, not a mean of rates.
    assert (group.requests, group.draft_tokens, group.accepted_tokens) == (3, 20, 4)
    assert group.acceptance == pytest.approx(0.2)
    assert group.series == pytest.approx([1.0, 0.5, 12 / 22, 4 / 20])
    assert len(group.series) == len(rows)
    assert group.retrain_wanted is True


def test_records_are_ordered_by_time_not_input_order():
    rows = [_row(0, 10, 10), _row(1, 10, 0), _row(2, 10, 0)]
    (in_order,) = rolling_acceptance(rows, window=2)
    (shuffled,) = rolling_acceptance([rows[2], rows[0], rows[1]], window=2)
    assert shuffled == in_order
    assert in_order.acceptance == 0.0


def test_groups_by_workload_and_hardware():
    rows = [
        _row(0, 4, 4, workload="sharegpt"),
        _row(1, 4, 1, workload="grounded"),
        _row(2, 4, 3, workload="grounded", hardware="cpu-stock"),
        _row(3, 4, 0, workload="sharegpt"),
    ]
    groups = rolling_acceptance(rows, window=50, threshold=0.5)
    assert [(g.workload, g.hardware) for g in groups] == [
        ("grounded", "cpu"),
        ("grounded", "cpu-stock"),
        ("sharegpt", "cpu"),
    ]
    assert [g.acceptance for g in groups] == [0.25, 0.75, 0.5]
    assert [g.retrain_wanted for g in groups] == [True, False, False]  # 0.5 is not below 0.5
    assert [g.requests for g in groups] == [1, 1, 2]
    assert groups[2].series == [1.0, 0.5]


def test_nothing_drafted_is_no_evidence():
    rows = [_row(0, 0, 0), _row(1, 0, 0)]
    (group,) = rolling_acceptance(rows, window=5, threshold=0.9)
    assert group.acceptance is None
    assert group.retrain_wanted is False
    assert group.series == [None, None]
    # A request that drafted nothing does not dilute the pooled rate either.
    (mixed,) = rolling_acceptance([*rows, _row(2, 4, 2)], window=5, threshold=0.9)
    assert (mixed.acceptance, mixed.requests, mixed.series) == (0.5, 3, [None, None, 0.5])


def test_window_of_one_is_the_latest_request():
    rows = [_row(0, 4, 0), _row(1, 4, 4)]
    (group,) = rolling_acceptance(rows, window=1, threshold=0.5)
    assert (group.acceptance, group.retrain_wanted, group.series) == (1.0, False, [0.0, 1.0])


def test_no_records_no_groups():
    assert rolling_acceptance([]) == []


@pytest.mark.parametrize("window", [0, -3])
def test_bad_window_raises(window):
    with pytest.raises(ValueError, match="window must be >= 1"):
        rolling_acceptance([_row(0, 1, 1)], window=window)


def test_to_dict_is_json_ready():
    import json

    (group,) = rolling_acceptance([_row(0, 4, 1)])
    payload = json.loads(json.dumps(group.model_dump(mode="json")))
    assert payload == {
        "workload": "grounded",
        "hardware": "cpu",
        "requests": 1,
        "draft_tokens": 4,
        "accepted_tokens": 1,
        "acceptance": 0.25,
        "retrain_wanted": True,
        "series": [0.25],
    }
