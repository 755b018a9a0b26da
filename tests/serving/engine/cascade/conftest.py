"""A tiny acceptance predictor (random weights) for cascade tests on tiny models."""

from __future__ import annotations

import pytest
import torch

from serving.engine.drafters.kinds import STAGES
from serving.engine.predictor import FEATURE_NAMES, AcceptancePredictor, Shrinkage, make_mlp


def tiny_predictor(hardware: str = "cpu", stages=STAGES, seed: int = 0):
    torch.manual_seed(seed)
    return AcceptancePredictor(
        make_mlp(),
        mean=torch.zeros(len(FEATURE_NAMES)),
        std=torch.ones(len(FEATURE_NAMES)),
        shrinkage=Shrinkage(strength=5.0, stage_prior={"pld": 0.3}),
        hardware=hardware,
        stages=stages,
    )


@pytest.fixture
def predictor():
    return tiny_predictor()
