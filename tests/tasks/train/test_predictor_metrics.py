"""The predictor's metrics against hand-computed values, and the evaluation's layout."""

from __future__ import annotations

import math

import pytest
import torch

from serving.engine.features import TokenFeatures
from serving.engine.predictor import FEATURE_NAMES, AcceptancePredictor, Shrinkage, make_mlp
from tasks.train.predictor_data import LabelledRows
from tasks.train.predictor_metrics import (
    ALL,
    RAW,
    SHRUNK,
    brier_score,
    calibration_bins,
    evaluate_predictor,
    expected_calibration_error,
    roc_auc,
    score,
)


@pytest.mark.parametrize(
    "labels, scores, expected",
    [
        ([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9], 1.0),  # perfectly ranked
        ([0, 0, 1, 1], [0.9, 0.8, 0.2, 0.1], 0.0),  # reversed
        # Pairs (pos, neg): (0.35, 0.1) yes, (0.35, 0.4) no, (0.8, 0.1) yes, (0.8, 0.4) yes.
        ([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8], 0.75),
        # A tie counts one half: (0.5, 0.2) 1, (0.5, 0.5) 1/2 -> 1.5 / 2.
        ([0, 0, 1], [0.2, 0.5, 0.5], 0.75),
        ([0, 1], [0.5, 0.5], 0.5),  # all tied
    ],
)
def test_auc_by_hand(labels, scores, expected):
    assert roc_auc([bool(v) for v in labels], scores) == pytest.approx(expected)


def test_auc_is_undefined_with_one_label():
    assert roc_auc([True, True], [0.2, 0.9]) is None
    assert roc_auc([False], [0.3]) is None


def test_brier_by_hand():
    # ((0.8 - 1)^2 + (0.3 - 0)^2) / 2 = (0.04 + 0.09) / 2
    assert brier_score([True, False], [0.8, 0.3]) == pytest.approx(0.065)
    assert brier_score([True, False], [0.5, 0.5]) == pytest.approx(0.25)


def test_ece_by_hand():
    probs = [0.05, 0.15, 0.12, 0.95, 1.0]
    labels = [False, True, False, True, True]
    # bin 0: p 0.05, y 0 -> |0.05 - 0| = 0.05 (1 row)
    # bin 1: p 0.135, y 0.5 -> 0.365 (2 rows)
    # bin 9: p 0.975 (1.0 falls in the last bin), y 1 -> 0.025 (2 rows)
    expected = (1 * 0.05 + 2 * 0.365 + 2 * 0.025) / 5
    assert expected_calibration_error(labels, probs) == pytest.approx(expected)
    bins = calibration_bins(labels, probs)
    assert [(b.lower, b.rows) for b in bins] == [(0.0, 1), (0.1, 2), (0.9, 2)]
    assert bins[1].predicted == pytest.approx(0.135) and bins[1].observed == 0.5


def test_ece_bin_edges_are_half_open():
    bins = calibration_bins([True, False, True], [0.1, 0.0999, 0.5])
    assert [(b.lower, b.rows) for b in bins] == [(0.0, 1), (0.1, 1), (0.5, 1)]


def test_a_calibrated_constant_has_no_calibration_error():
    labels = [True, False, False, False]
    assert expected_calibration_error(labels, [0.25] * 4) == pytest.approx(0.0)
    result = score(labels, [0.25] * 4)
    assert (result.rows, result.observed, result.predicted) == (4, 0.25, 0.25)
    assert result.auc == 0.5 and result.brier == pytest.approx(0.1875)


def test_mismatched_or_empty_inputs_are_refused():
    with pytest.raises(ValueError, match="equal"):
        brier_score([True], [0.1, 0.2])
    with pytest.raises(ValueError, match="no rows"):
        score([], [])


def _row(stage: str, position: int, match_len: int) -> TokenFeatures:
    return TokenFeatures(
        stage=stage,
        stage_index=0,
        position=position,
        draft_confidence=None,
        draft_entropy=None,
        match_len=match_len,
        target_entropy=1.0,
        recent_logprob=-1.0,
        length_ratio=0.5,
    )


@pytest.fixture
def rows() -> LabelledRows:
    features = [_row("pld", i % 4, i % 5) for i in range(12)] + [_row("ngram", 0, 2)] * 3
    labels = [i % 3 == 0 for i in range(12)] + [True, True, True]  # ngram: one label only
    return LabelledRows(features, labels, [f"r{i // 3}" for i in range(15)])


def _predictor(strength: float) -> AcceptancePredictor:
    torch.manual_seed(0)
    n = len(FEATURE_NAMES)
    counts = {"pld/0/4": 1} if strength else {}
    return AcceptancePredictor(
        make_mlp(n, 8),
        mean=torch.zeros(n),
        std=torch.ones(n),
        shrinkage=Shrinkage(strength, counts, {"pld": 0.3, "ngram": 0.9}, 0.5),
        hardware="cpu",
    )


def test_evaluation_groups_variants_and_flat_metrics(rows):
    evaluation = evaluate_predictor(_predictor(10.0), rows)
    assert list(evaluation.groups) == [ALL, "ngram", "pld"]
    assert evaluation.overall is evaluation.groups[ALL][SHRUNK]
    assert evaluation.overall.rows == 15 and evaluation.groups["pld"][RAW].rows == 12
    flat = evaluation.flat()
    for key in ("auc", "brier", "ece", "rows", "raw/auc", "raw/ece", "pld/auc", "pld/raw/brier"):
        assert key in flat, key
    assert "ngram/auc" not in flat  # undefined with one label: left out, never NaN
    assert flat["ngram/brier"] >= 0 and flat["ngram/rows"] == 3
    assert all(math.isfinite(v) for v in flat.values())
    nested = evaluation.to_dict()
    assert nested["rows"] == 15 and nested["by_stage"]["ngram"]["shrunk"]["auc"] is None
    assert set(nested["by_stage"]) == {"ngram", "pld"}
    table = evaluation.table()
    assert "shrunk / raw" in table and "ngram" in table and "  n/a" in table
    plotted = evaluation.reliability_rows()
    assert {(r["group"], r["variant"]) for r in plotted} == {
        (g, v) for g in (ALL, "ngram", "pld") for v in (SHRUNK, RAW)
    }
    assert sum(r["rows"] for r in plotted if r["group"] == ALL and r["variant"] == RAW) == 15


def test_shrinkage_moves_predictions_toward_the_stage_prior(rows):
    shrunk = evaluate_predictor(_predictor(10.0), rows)
    # Every ngram region is unseen (count 0): its shrunk prediction is the stage prior.
    assert shrunk.groups["ngram"][SHRUNK].predicted == pytest.approx(0.9)
    assert shrunk.groups["ngram"][RAW].predicted != pytest.approx(0.9)


def test_without_shrinkage_both_variants_agree(rows):
    evaluation = evaluate_predictor(_predictor(0.0), rows)
    for group in evaluation.groups.values():
        assert group[SHRUNK].to_dict() == group[RAW].to_dict()
