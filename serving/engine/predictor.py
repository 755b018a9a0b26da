"""The acceptance predictor: P(the target accepts this drafted token | the drafts before it
were accepted), from the token's :class:`~serving.engine.features.TokenFeatures`.

A small MLP (torch) scores a feature row; its output is then shrunk toward the stage's
prior acceptance where the training data observed that feature region thinly::

    p = (n_r * p_mlp + m * prior_stage) / (n_r + m)

with ``n_r`` the training rows in the row's region (stage, block position, MLP-score decile)
and ``m`` the prior strength: a well-observed region keeps the MLP's score, a thin one
leans on the stage's measured base rate (a Beta posterior mean). Training and evaluation
live in ``tasks/train/predictor.py``; this module only scores, saves and loads.

A saved predictor is a folder: ``predictor.safetensors`` (weights) and ``predictor.json`` (feature
set, hardware target, normalisation, shrinkage table, metrics). Loading refuses a folder
made for another feature set or another hardware target, naming both, before any weights
are read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from serving.atomic import write_text_atomic
from serving.engine.drafters.kinds import STAGES
from serving.engine.features import FEATURE_SET, TokenFeatures
from serving.errors import BadInputError
from serving.hardware import HardwareTarget

PREDICTOR_FILE = "predictor.json"
WEIGHTS_FILE = "predictor.safetensors"
N_POSITION_BUCKETS = 8
N_SCORE_BUCKETS = 10
FEATURE_NAMES = (
    "position",
    "stage_index",
    "draft_confidence",
    "draft_confidence_missing",
    "draft_entropy",
    "draft_entropy_missing",
    "match_len",
    "match_len_missing",
    "target_entropy",
    "recent_logprob",
    "log_length_ratio",
    *(f"stage_{kind}" for kind in STAGES),
)


class PredictorError(BadInputError):
    """A predictor folder that cannot serve here (wrong feature set or target, damaged)."""


def vectorize(rows: Sequence[TokenFeatures]) -> torch.Tensor:
    """``[len(rows), len(FEATURE_NAMES)]`` float32, missing values as 0 plus an indicator."""
    table = []
    for row in rows:
        if row.stage not in STAGES:
            raise BadInputError(f"unknown stage {row.stage!r}; stages are {STAGES}")
        confidence, entropy, matched = row.draft_confidence, row.draft_entropy, row.match_len
        table.append(
            [
                min(row.position, 31),
                row.stage_index,
                0.0 if confidence is None else confidence,
                confidence is None,
                0.0 if entropy is None else entropy,
                entropy is None,
                0.0 if matched is None else min(matched, 64),
                matched is None,
                row.target_entropy,
                max(row.recent_logprob, -20.0),
                math.log1p(max(row.length_ratio, 0.0)),
                *(row.stage == kind for kind in STAGES),
            ]
        )
    if not table:
        return torch.zeros(0, len(FEATURE_NAMES), dtype=torch.float32)
    return torch.tensor(table, dtype=torch.float32)


def make_mlp(n_features: int = len(FEATURE_NAMES), hidden: int = 32) -> nn.Module:
    return nn.Sequential(
        nn.Linear(n_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 1),
    )


def region_keys(rows: Sequence[TokenFeatures], scores: torch.Tensor) -> list[str]:
    """The shrinkage region of each row: stage, block position bucket, score decile."""
    keys = []
    for row, score in zip(rows, scores.tolist(), strict=True):
        position = min(row.position, N_POSITION_BUCKETS - 1)
        decile = min(int(score * N_SCORE_BUCKETS), N_SCORE_BUCKETS - 1)
        keys.append(f"{row.stage}/{position}/{decile}")
    return keys


@dataclass
class Shrinkage:
    """Counts of training rows per region and each stage's prior acceptance."""

    strength: float = 10.0  # m: pseudo-observations of the prior
    counts: dict[str, int] = field(default_factory=dict)
    stage_prior: dict[str, float] = field(default_factory=dict)
    default_prior: float = 0.5

    def __post_init__(self) -> None:
        if not self.strength >= 0:
            raise BadInputError(f"shrinkage strength must be >= 0, got {self.strength!r}")

    @classmethod
    def fit(
        cls,
        rows: Sequence[TokenFeatures],
        scores: torch.Tensor,
        labels: Sequence[bool],
        *,
        strength: float = 10.0,
        prior_a: float = 1.0,
        prior_b: float = 1.0,
    ) -> Shrinkage:
        """Region counts from the training rows, and per-stage Beta(a, b) posterior means."""
        counts: dict[str, int] = {}
        for key in region_keys(rows, scores):
            counts[key] = counts.get(key, 0) + 1
        kept: dict[str, float] = {}
        seen: dict[str, float] = {}
        for row, label in zip(rows, labels, strict=True):
            kept[row.stage] = kept.get(row.stage, 0.0) + bool(label)
            seen[row.stage] = seen.get(row.stage, 0.0) + 1.0
        stage_prior = {s: (kept[s] + prior_a) / (seen[s] + prior_a + prior_b) for s in seen}
        total = sum(seen.values())
        default = (sum(kept.values()) + prior_a) / (total + prior_a + prior_b)
        return cls(strength, counts, stage_prior, default)

    def apply(self, rows: Sequence[TokenFeatures], scores: torch.Tensor) -> torch.Tensor:
        if self.strength == 0:
            return scores
        n = torch.tensor(
            [float(self.counts.get(key, 0)) for key in region_keys(rows, scores)],
            dtype=scores.dtype,
        )
        prior = torch.tensor(
            [self.stage_prior.get(row.stage, self.default_prior) for row in rows],
            dtype=scores.dtype,
        )
        return (n * scores + self.strength * prior) / (n + self.strength)


class AcceptancePredictor:
    """Scores drafted tokens; shrinkage on by default (``shrink=False`` for the ablation)."""

    def __init__(
        self,
        mlp: nn.Module,
        *,
        mean: torch.Tensor,
        std: torch.Tensor,
        shrinkage: Shrinkage,
        hardware: str,
        stages: Sequence[str] = STAGES,
        metrics: dict[str, object] | None = None,
        hidden: int = 32,
    ) -> None:
        self.mlp = mlp.eval()
        self.mean = mean
        self.std = std.clamp_min(1e-6)
        self.shrinkage = shrinkage
        self.hardware = hardware
        self.stages = tuple(stages)
        self.metrics = dict(metrics or {})
        self.hidden = hidden
        self.shrink = True

    @torch.inference_mode()
    def raw(self, rows: Sequence[TokenFeatures]) -> torch.Tensor:
        """The MLP's probabilities, before shrinkage, ``[len(rows)]``."""
        if not rows:
            return torch.empty(0)
        x = (vectorize(rows) - self.mean) / self.std
        return torch.sigmoid(self.mlp(x)[:, 0])

    def predict(self, rows: Sequence[TokenFeatures]) -> torch.Tensor:
        scores = self.raw(rows)
        if not self.shrink or not rows:
            return scores
        return self.shrinkage.apply(rows, scores)

    def describe(self) -> dict[str, object]:
        return {
            "feature_set": FEATURE_SET,
            "hardware": self.hardware,
            "stages": list(self.stages),
            "shrinkage_strength": self.shrinkage.strength,
            "shrink": self.shrink,
        }

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / (WEIGHTS_FILE + ".tmp")
        save_file({k: v.contiguous() for k, v in self.mlp.state_dict().items()}, str(tmp))
        tmp.replace(folder / WEIGHTS_FILE)
        meta = {
            "feature_set": FEATURE_SET,
            "feature_names": list(FEATURE_NAMES),
            "hardware": self.hardware,
            "stages": list(self.stages),
            "hidden": self.hidden,
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "shrinkage": {
                "strength": self.shrinkage.strength,
                "counts": self.shrinkage.counts,
                "stage_prior": self.shrinkage.stage_prior,
                "default_prior": self.shrinkage.default_prior,
            },
            "metrics": self.metrics,
        }
        write_text_atomic(folder / PREDICTOR_FILE, json.dumps(meta, indent=1, sort_keys=True))
        return folder


def read_predictor_meta(folder: str | Path) -> dict:
    path = Path(folder) / PREDICTOR_FILE
    if not path.is_file():
        raise PredictorError(f"{str(folder)!r} is not a predictor folder: no {PREDICTOR_FILE}")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise PredictorError(f"{str(path)!r} is not valid JSON: {error}") from None
    if not isinstance(meta, dict):
        raise PredictorError(f"{str(path)!r} does not hold a predictor description")
    return meta


def check_predictor(folder: str | Path, *, hardware: HardwareTarget | None = None) -> dict:
    """Refuse a predictor made for another feature set or hardware target (no weights read)."""
    meta = read_predictor_meta(folder)
    made_for = meta.get("feature_set")
    if made_for != FEATURE_SET:
        raise PredictorError(
            f"the predictor at {str(folder)!r} was trained on feature set {made_for!r}, but "
            f"this engine computes {FEATURE_SET!r}; retrain it (specops predictor train)"
        )
    if hardware is not None and meta.get("hardware") != hardware.name:
        raise PredictorError(
            f"the predictor at {str(folder)!r} was trained for hardware target "
            f"{meta.get('hardware')!r}, not {hardware.name!r}; use that target's predictor "
            f"(alias champion-{hardware.name}) or train one for it"
        )
    return meta


def load_predictor(
    folder: str | Path, *, hardware: HardwareTarget | None = None
) -> AcceptancePredictor:
    meta = check_predictor(folder, hardware=hardware)
    weights = Path(folder) / WEIGHTS_FILE
    if not weights.is_file():
        raise PredictorError(f"the predictor at {str(folder)!r} has no {WEIGHTS_FILE}")
    try:
        hidden = int(meta["hidden"])
        mlp = make_mlp(len(FEATURE_NAMES), hidden)
        mlp.load_state_dict(load_file(str(weights), device="cpu"))
        shrink = meta["shrinkage"]
        shrinkage = Shrinkage(
            float(shrink["strength"]),
            {str(k): int(v) for k, v in shrink["counts"].items()},
            {str(k): float(v) for k, v in shrink["stage_prior"].items()},
            float(shrink["default_prior"]),
        )
        return AcceptancePredictor(
            mlp,
            mean=torch.tensor(meta["mean"], dtype=torch.float32),
            std=torch.tensor(meta["std"], dtype=torch.float32),
            shrinkage=shrinkage,
            hardware=str(meta["hardware"]),
            stages=meta.get("stages", STAGES),
            metrics=meta.get("metrics", {}),
            hidden=hidden,
        )
    except (KeyError, TypeError, ValueError, RuntimeError, SafetensorError) as error:
        raise PredictorError(f"the predictor at {str(folder)!r} is damaged: {error}") from None
