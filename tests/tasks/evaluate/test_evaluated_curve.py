"""The evaluated verify curve: median seconds of a pass over n tokens over a one-token
pass's, from the evaluation's own steps (sizes seen too rarely follow the profiled curve);
and several evaluations' curves pooled into one a target's verify_curve can take."""

from __future__ import annotations

import pytest

from serving.engine.metrics import StepRecord
from serving.errors import BadInputError
from tasks.evaluate.evaluated_curve import (
    evaluated_curve,
    pooled_curve,
    rounds_curve,
    verify_seconds_by_size,
)
from tests.tasks.evaluate.test_priced import evaluation


def _steps(proposed: int, seconds: list[float]) -> list[StepRecord]:
    return [StepRecord(proposed, 0, 1, 0.0, s) for s in seconds]


def test_each_size_is_its_median_pass_over_the_one_token_median():
    steps = (
        _steps(0, [0.010] * 7 + [0.500])  # one stalled pass: the median ignores it
        + _steps(3, [0.013] * 8)
        + _steps(1, [0.011] * 9)
    )
    curve, passes = evaluated_curve(steps, profiled=[1.0, 1.5, 1.6, 1.7, 1.8], min_passes=8)
    assert passes == [8, 9, 0, 8, 0]
    assert curve[0] == 1.0 and curve[1] == pytest.approx(1.1) and curve[3] == pytest.approx(1.3)
    # unmeasured sizes: profiled, times the measured-over-profiled ratio interpolated
    # between the measured sizes around (past the last: its ratio)
    assert curve[2] == pytest.approx(1.6 * (1.1 / 1.5 + 1.3 / 1.7) / 2)
    assert curve[4] == pytest.approx(1.8 * 1.3 / 1.7)


def test_a_rarely_seen_size_is_not_measured_and_the_curve_never_falls():
    steps = (
        _steps(0, [0.01] * 8) + _steps(1, [0.02] * 8) + _steps(2, [0.012] * 3)
        + _steps(3, [0.015] * 8)
    )  # fmt: skip
    curve, passes = evaluated_curve(steps, profiled=[1.0, 1.2, 1.5, 1.6], min_passes=8)
    # size 3, seen 3 times, is priced 1.5 times the ratio halfway between size 2's
    # (2.0 / 1.2) and size 4's (1.5 / 1.6): 1.953, raised to size 2's 2.0; size 4 too
    assert passes == [8, 8, 0, 8]
    assert curve == pytest.approx([1.0, 2.0, 2.0, 2.0])


def test_sizes_past_the_profile_extend_the_curve():
    steps = _steps(0, [0.01] * 8) + _steps(5, [0.02] * 8)
    curve, passes = evaluated_curve(steps, profiled=[1.0, 1.1], min_passes=8)
    assert len(curve) == 6 and curve[5] == pytest.approx(2.0) and passes[5] == 8
    # sizes 2-5: the profiled curve extended at its slope (1.2, 1.3, 1.4 at n = 3..5),
    # times a ratio going from size 1's 1.0 to size 6's 2.0 / 1.5 (at n = 3: 2/5 of the way)
    assert curve[2] == pytest.approx(1.2 * (1.0 + 0.4 * (2.0 / 1.5 - 1.0)))


def test_too_few_one_token_passes_give_no_curve():
    steps = _steps(0, [0.01] * 7) + _steps(3, [0.02] * 50)
    assert evaluated_curve(steps, profiled=[1.0, 1.1]) == ([], [])


def test_untimed_steps_are_left_out():
    steps = _steps(0, [0.0, 0.01]) + _steps(2, [0.03])
    assert verify_seconds_by_size(steps) == {1: [0.01], 3: [0.03]}


def _evaluated(curve: list[float], passes: list[int], hardware: str = "cpu"):
    return evaluation().model_copy(
        update={"hardware": hardware, "evaluated_curve": curve, "evaluated_passes": passes}
    )


def test_pooled_each_size_is_the_median_over_the_evaluations_that_verified_it():
    reports = [
        _evaluated([1.0, 1.1, 1.2], [90, 20, 9]),
        _evaluated([1.0, 1.3, 1.25], [80, 30, 0]),  # size 3 interpolated here: left out
        _evaluated([1.0, 1.2, 1.4, 1.5], [70, 10, 8, 0]),
    ]
    curve, passes = pooled_curve(reports, "cpu")
    # size 4 was verified by none: the median of every evaluation that has it (1.5)
    assert curve == pytest.approx([1.0, 1.2, 1.3, 1.5]) and passes == 317


def test_pooled_refuses_another_target_or_a_report_without_a_curve():
    with pytest.raises(BadInputError, match="evaluation 2 ran on 'cpu-int4', not on 'cpu'"):
        pooled_curve([_evaluated([1.0], [9]), _evaluated([1.0], [9], "cpu-int4")], "cpu")
    with pytest.raises(BadInputError, match="evaluation 1 has no evaluated verify curve"):
        pooled_curve([evaluation()], "cpu")
    with pytest.raises(BadInputError, match="no evaluation reports"):
        pooled_curve([], "cpu")


def test_the_rounds_set_the_curve_and_the_recording_joins_only_when_they_cannot():
    # Plain decoding's recording ran on a slower moment (0.02 s a one-token pass).
    recorded = _steps(0, [0.02] * 64)
    timed = _steps(0, [0.01] * 8) + _steps(3, [0.013] * 8)
    curve, passes = rounds_curve(timed, recorded, profiled=[1.0, 1.1, 1.2, 1.3])
    assert curve[3] == pytest.approx(1.3) and passes[0] == 8  # the recording left out
    # Rounds that verified too few one-token blocks: the recording sets the unit.
    curve, passes = rounds_curve(timed[1:], recorded, profiled=[1.0, 1.1, 1.2, 1.3])
    assert passes[0] == 64 + 7 and curve[3] == pytest.approx(1.0)  # 0.013 < 0.02: raised
    assert rounds_curve(timed[1:], [], profiled=[1.0]) == ([], [])
