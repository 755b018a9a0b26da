"""The stability study's verdict per run: the label the gates would leave as champion, from
one evaluation report, under the gates' config, under the wall-clock-only rule, and on the
speed or verify curve an earlier study asked for (``--speed``, ``--modelled-curve``)."""

from __future__ import annotations

import pytest

from benchmarks.gate_stability import judged, main, winner
from tasks.evaluate.modelled import modelled_report
from tests.tasks.evaluate.test_gates import CONFIG, report, result
from tests.tasks.evaluate.test_priced import evaluation

NAMES = {"champion": "suffix/1", "challenger": "suffix/2"}


def test_a_challenger_past_the_margin_is_the_winner():
    # These reports carry no checks to model: judged by measured speed, as the study can.
    label, verdicts = winner(report(result(1.40), result(1.20)), CONFIG, NAMES, speed="measured")
    assert label == "suffix/2"
    assert verdicts["suffix/2"].startswith("all gates passed (measured speed)")


def test_within_the_margin_the_champion_stays():
    # 1.22 over 1.20 is under the 3 % the gates ask: nothing moves, and the verdict says why.
    measured = report(result(1.22), result(1.20))
    label, verdicts = winner(measured, CONFIG, NAMES, speed="measured")
    assert label == "suffix/1"
    assert verdicts["suffix/2"].startswith("refused") and "1.22" in verdicts["suffix/2"]


def test_the_study_judges_as_the_product_unless_told_otherwise():
    # Measured 0.5x (a busy machine); modelled 1.5x on the flat fixed curve, 0.8x on the
    # evaluated one (a five-token pass twice a one-token one).
    busy = evaluation().model_copy(
        update={
            "verify_curve": [1.0] * 5,
            "draft_costs": {"challenger": 0.0},
            "evaluated_curve": [1.0, 1.0, 1.0, 1.0, 2.0],
            "evaluated_passes": [9] * 5,
        }
    )
    assert judged(busy, CONFIG) == modelled_report(busy)
    assert judged(busy, CONFIG).results["challenger"].speedup == pytest.approx(1.5)
    assert judged(busy, CONFIG, speed="measured") is busy
    on_evaluated = judged(busy, CONFIG, curve="evaluated")
    assert on_evaluated.results["challenger"].speedup == pytest.approx(24 / 30)
    # On the held-out traffic, which the gates read: 3x on the fixed curve, 2x on the
    # evaluated one, 0.5x measured; with no champion, 2.5x over plain decoding is needed.
    names = {"champion": "plain", "challenger": "pld/1"}
    gates = CONFIG.model_copy(update={"min_prompts": 2, "min_speedup_gain": 1.5})
    assert winner(busy, gates, names)[0] == "pld/1"
    assert winner(busy, gates, names, speed="measured")[0] == "plain"
    assert winner(busy, gates, names, curve="evaluated")[0] == "plain"


def test_the_options_take_only_what_they_name(capsys):
    for option in (["--speed", "clock"], ["--modelled-curve", "quiet"]):
        with pytest.raises(SystemExit):
            main(["--threads", "1", "--out", "x.json", *option])
        assert "invalid choice" in capsys.readouterr().err
