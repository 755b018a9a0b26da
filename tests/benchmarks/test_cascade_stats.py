"""The sweep's statistics: ROUGE-L on token ids and t intervals."""

from __future__ import annotations

import pytest

from benchmarks.cascade_stats import mean_ci, rouge_l


def test_rouge_l_by_hand():
    assert rouge_l([1, 2, 3], [1, 2, 3]) == 1.0
    assert rouge_l([], []) == 1.0 and rouge_l([1], []) == 0.0
    # LCS of (1 2 3 4) and (1 3 4 5 6) is (1 3 4): P = 3/4, R = 3/5
    assert rouge_l([1, 2, 3, 4], [1, 3, 4, 5, 6]) == pytest.approx(2 * 0.75 * 0.6 / 1.35)
    assert rouge_l([7, 8], [1, 2]) == 0.0


def test_mean_ci_is_a_t_interval():
    ci = mean_ci([1.0, 2.0, 3.0])
    # mean 2, sd 1, sem 1/sqrt(3), t(0.975, 2) = 4.302653
    assert ci["mean"] == pytest.approx(2.0)
    assert ci["high"] - ci["mean"] == pytest.approx(4.302653 / 3**0.5, rel=1e-5)
    assert mean_ci([5.0])["low"] is None and mean_ci([])["mean"] is None
    bounded = mean_ci([0.2, 0.9, 1.0], bounds=(0.0, 1.0))
    assert bounded["high"] == 1.0 and bounded["low"] >= 0.0
