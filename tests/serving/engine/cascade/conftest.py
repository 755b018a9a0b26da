"""A tiny acceptance predictor (random weights) for cascade tests on tiny models, and the
tiny target as a cascade serves it: on hardware target ``cpu`` (the name a predictor is
checked against), pricing passes with :data:`serving.curves.DEFAULT_VERIFY_CURVE`."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from serving.curves import DEFAULT_VERIFY_CURVE
from serving.engine.drafters.kinds import STAGES
from serving.engine.predictor import FEATURE_NAMES, AcceptancePredictor, Shrinkage, make_mlp
from serving.hardware import engine_target
from serving.target import LoadedTarget


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


@pytest.fixture(scope="session")
def cascade_target(target: PreTrainedModel) -> LoadedTarget:
    """The tiny target taken as it is, on hardware target ``cpu`` with the default verify
    curve (no end-of-sequence ids: decoding runs to its budget)."""
    hardware = engine_target("cpu").model_copy(update={"verify_curve": list(DEFAULT_VERIFY_CURVE)})
    return LoadedTarget.of(target, hardware=hardware)
