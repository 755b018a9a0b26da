"""The stability study's verdict per run: the label the gates would leave as champion, from
one evaluation report, under the gates' config and under the wall-clock-only rule."""

from __future__ import annotations

from benchmarks.gate_stability import winner
from tests.tasks.evaluate.test_gates import CONFIG, report, result

NAMES = {"champion": "suffix/1", "challenger": "suffix/2"}
MEASURED = CONFIG.model_copy(update={"speed": "measured"})  # the reports carry no curves


def test_a_challenger_past_the_margin_is_the_winner():
    label, verdicts = winner(report(result(1.40), result(1.20)), MEASURED, NAMES)
    assert label == "suffix/2"
    assert verdicts["suffix/2"].startswith("all gates passed")


def test_within_the_margin_the_champion_stays():
    # 1.22 over 1.20 is under the 3 % the gates ask: nothing moves, and the verdict says why.
    label, verdicts = winner(report(result(1.22), result(1.20)), MEASURED, NAMES)
    assert label == "suffix/1"
    assert verdicts["suffix/2"].startswith("refused") and "1.22" in verdicts["suffix/2"]
