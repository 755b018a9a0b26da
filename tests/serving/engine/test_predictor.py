"""The acceptance predictor's scoring side: shrinkage toward the prior where the region is
thin, save/load round trip, refusals naming what is wrong."""

from __future__ import annotations

import pytest
import torch

from serving.engine.features import TokenFeatures
from serving.engine.predictor import (
    FEATURE_NAMES,
    PredictorError,
    Shrinkage,
    load_predictor,
    region_keys,
    vectorize,
)
from serving.errors import BadInputError
from serving.hardware import hardware_target
from tests.serving.engine.cascade.conftest import tiny_predictor


def _row(stage="pld", position=0, confidence=None, match_len=3):
    return TokenFeatures(
        stage=stage,
        stage_index=0,
        position=position,
        draft_confidence=confidence,
        draft_entropy=None,
        match_len=match_len,
        target_entropy=1.5,
        recent_logprob=-0.7,
        length_ratio=0.4,
    )


def test_vectorize_marks_missing_values_and_one_hot_stage():
    x = vectorize([_row(), _row(stage="head", confidence=0.8, match_len=None)])
    names = list(FEATURE_NAMES)
    assert x.shape == (2, len(names))
    assert x[0, names.index("draft_confidence_missing")] == 1
    assert x[1, names.index("draft_confidence")] == pytest.approx(0.8)
    assert x[1, names.index("match_len_missing")] == 1
    assert x[0, names.index("stage_pld")] == 1 and x[1, names.index("stage_head")] == 1


def test_vectorize_refuses_an_unknown_stage():
    with pytest.raises(BadInputError, match="unknown stage 'warp'"):
        vectorize([_row(stage="warp")])


def test_shrinkage_moves_thin_regions_toward_the_prior_and_keeps_thick_ones():
    rows = [_row(position=0)] * 1000 + [_row(position=5)] * 2
    scores = torch.tensor([0.9] * 1002)
    labels = [True] * 900 + [False] * 100 + [False, False]
    shrinkage = Shrinkage.fit(rows, scores, labels, strength=10.0)
    thick, thin = _row(position=0), _row(position=5)
    out = shrinkage.apply([thick, thin], torch.tensor([0.9, 0.9]))
    prior = shrinkage.stage_prior["pld"]
    assert abs(out[0] - 0.9) < 0.001  # 1000 rows: the MLP's score stands
    assert abs(out[1] - prior) < abs(0.9 - prior)  # 2 rows: pulled toward the prior
    assert out[1] == pytest.approx((2 * 0.9 + 10 * prior) / 12)
    # a region never observed is the prior itself
    unseen = shrinkage.apply([_row(position=7)], torch.tensor([0.05]))
    assert unseen[0] == pytest.approx(prior)


def test_region_keys_bucket_positions_and_scores():
    keys = region_keys([_row(position=3), _row(position=30)], torch.tensor([0.05, 0.999]))
    assert keys == ["pld/3/0", "pld/7/9"]


def test_save_and_load_round_trip(tmp_path):
    predictor = tiny_predictor()
    rows = [_row(), _row(stage="suffix", confidence=0.5)]
    folder = predictor.save(tmp_path / "p")
    loaded = load_predictor(folder, hardware=hardware_target("cpu"))
    assert torch.allclose(loaded.predict(rows), predictor.predict(rows))
    loaded.shrink = False
    assert torch.allclose(loaded.predict(rows), predictor.raw(rows))


def test_damaged_or_missing_predictors_are_refused(tmp_path):
    with pytest.raises(PredictorError, match="not a predictor folder"):
        load_predictor(tmp_path)
    folder = tiny_predictor().save(tmp_path / "p")
    (folder / "predictor.safetensors").write_bytes(b"garbage")
    with pytest.raises(PredictorError, match="damaged"):
        load_predictor(folder)
    (folder / "predictor.json").write_text("{")
    with pytest.raises(PredictorError, match="not valid JSON"):
        load_predictor(folder)
