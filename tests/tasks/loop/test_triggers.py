import pytest

from serving.hardware import hardware_target
from tasks.data.acceptance import PooledAcceptance
from tasks.loop.triggers import decide_retrain


def group(workload: str, acceptance: float | None, hardware: str = "cpu") -> PooledAcceptance:
    """A group with this rolling acceptance (the counts behind it do not matter here)."""
    return PooledAcceptance(
        workload=workload,
        hardware=hardware,
        requests=10,
        draft_tokens=100,
        accepted_tokens=0 if acceptance is None else round(100 * acceptance),
        acceptance=acceptance,
    )


TAGS = {
    "cpu/acceptance_rate": "0.6",
    "cpu/grounded/acceptance_rate": "0.9",
    "cpu/traffic:humaneval/acceptance_rate": "0.3",
}


def decide(groups, tags=TAGS, **overrides):
    settings = {
        "hardware": hardware_target("cpu"),
        "champion_tags": tags,
        "relative": 0.8,
        "absolute": 0.5,
        "last_retrain_at": None,
        "cooldown_s": 3600.0,
        "now": 10_000.0,
    }
    return decide_retrain(groups, **{**settings, **overrides})


def test_a_drop_relative_to_the_champion_triggers_where_an_absolute_threshold_would_not():
    # 0.6 on grounded is above the absolute 0.5 but below 0.8 x 0.9 = 0.72.
    trigger = decide([group("grounded", 0.6)])
    assert trigger.wanted and trigger.retrain
    assert "0.600 < 0.720" in trigger.reasons[0]


def test_a_workload_the_champion_never_did_well_does_not_retrain_forever():
    # 0.28 is far below the absolute 0.5, but the champion only ever accepted 0.3 here.
    trigger = decide([group("humaneval", 0.28)])
    assert not trigger.wanted
    assert "0.280 >= 0.240" in trigger.reasons[0]


def test_without_an_evaluation_the_absolute_threshold_applies():
    assert decide([group("grounded", 0.4)], tags=None).wanted
    assert not decide([group("grounded", 0.55)], tags=None).wanted


def test_other_targets_and_groups_without_drafts_are_ignored():
    trigger = decide([group("grounded", 0.1, hardware="cpu-stock"), group("grounded", None)])
    assert not trigger.wanted and trigger.reasons == []


def test_a_retrain_within_the_cool_down_is_held_back_with_the_time_left():
    trigger = decide([group("grounded", 0.1)], last_retrain_at=10_000.0 - 600)
    assert trigger.wanted and not trigger.allowed and not trigger.retrain
    assert "10 min ago" in trigger.held_back and "50 min" in trigger.held_back
    after = decide([group("grounded", 0.1)], last_retrain_at=10_000.0 - 3601)
    assert after.retrain and after.held_back is None


def test_a_relative_threshold_out_of_range_is_refused():
    with pytest.raises(ValueError, match="relative"):
        decide([group("grounded", 0.1)], relative=1.5)
