"""How good an acceptance predictor is, defined once (the CLI, the metrics file, the saved
predictor and the registry all read these).

For held-out drafted tokens with labels ``y_i`` (1: the target accepted it) and predicted
acceptance probabilities ``p_i``, ``i = 1..N``:

- **AUC**: ROC AUC, the probability that a random accepted token scores above a random
  rejected one, ties counting one half (the Mann-Whitney statistic; scikit-learn's
  ``roc_auc_score``). Undefined (``None``) when only one label occurs.
- **Brier score**: ``mean((p_i - y_i)^2)``; 0 is perfect, 0.25 is a constant 0.5
  (scikit-learn's ``brier_score_loss``).
- **ECE**, expected calibration error over ``N_BINS`` = 10 equal-width bins of ``p``
  (bin ``b`` holds ``b/10 <= p < (b+1)/10``, the last one also ``p = 1``):
  ``sum_b (n_b / N) * |mean(p in b) - mean(y in b)|``.

Each is reported overall (group :data:`ALL`) and per drafter stage (the ``stage`` feature),
for the predictor as it serves (``shrunk``: the MLP shrunk toward each stage's prior) and
for its MLP alone (``raw``), so the shrinkage's effect is visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from sklearn.metrics import brier_score_loss, roc_auc_score

from serving.engine.predictor import AcceptancePredictor
from tasks.train.predictor_data import LabelledRows

N_BINS = 10
ALL = "all"  # the group of every row (stage names are never "all")
SHRUNK, RAW = "shrunk", "raw"
VARIANTS = (SHRUNK, RAW)
METRIC_NAMES = ("auc", "brier", "ece")


def _arrays(labels: Sequence[bool], probs: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    if y.shape != p.shape or y.ndim != 1:
        raise ValueError(f"labels {y.shape} and predictions {p.shape} must be equal 1-D lists")
    if not y.size:
        raise ValueError("no rows to score")
    return y, p


def roc_auc(labels: Sequence[bool], scores: Sequence[float]) -> float | None:
    """ROC AUC with ties counting one half; ``None`` when only one label occurs."""
    y, p = _arrays(labels, scores)
    if y.min() == y.max():
        return None
    return float(roc_auc_score(y, p))


def brier_score(labels: Sequence[bool], probs: Sequence[float]) -> float:
    """``mean((p - y)^2)``."""
    y, p = _arrays(labels, probs)
    return float(brier_score_loss(y, p))


@dataclass(frozen=True)
class CalibrationBin:
    lower: float
    upper: float
    rows: int
    predicted: float  # mean predicted probability in the bin
    observed: float  # share of its rows the target accepted


def calibration_bins(
    labels: Sequence[bool], probs: Sequence[float], n_bins: int = N_BINS
) -> list[CalibrationBin]:
    """The non-empty equal-width bins of ``probs`` over [0, 1] (1 falls in the last)."""
    y, p = _arrays(labels, probs)
    index = np.clip(np.floor(p * n_bins).astype(np.int64), 0, n_bins - 1)
    out = []
    for b in range(n_bins):
        inside = index == b
        count = int(inside.sum())
        if count:
            out.append(
                CalibrationBin(
                    lower=b / n_bins,
                    upper=(b + 1) / n_bins,
                    rows=count,
                    predicted=float(p[inside].mean()),
                    observed=float(y[inside].mean()),
                )
            )
    return out


def expected_calibration_error(
    labels: Sequence[bool], probs: Sequence[float], n_bins: int = N_BINS
) -> float:
    """``sum_b (n_b / N) * |mean(p in b) - mean(y in b)|`` over ``n_bins`` equal bins."""
    return _ece(calibration_bins(labels, probs, n_bins))


def _ece(bins: Sequence[CalibrationBin]) -> float:
    total = sum(b.rows for b in bins)
    return float(sum(b.rows / total * abs(b.predicted - b.observed) for b in bins))


@dataclass(frozen=True)
class Scores:
    """One group's metrics for one variant of the predictor."""

    rows: int
    observed: float  # the group's acceptance rate (base rate)
    predicted: float  # the mean predicted probability
    auc: float | None
    brier: float
    ece: float
    bins: tuple[CalibrationBin, ...]

    def to_dict(self) -> dict[str, float | int | None]:
        return {k: v for k, v in asdict(self).items() if k != "bins"}


def score(labels: Sequence[bool], probs: Sequence[float]) -> Scores:
    y, p = _arrays(labels, probs)
    bins = calibration_bins(labels, probs)
    return Scores(
        rows=int(y.size),
        observed=float(y.mean()),
        predicted=float(p.mean()),
        auc=roc_auc(labels, probs),
        brier=brier_score(labels, probs),
        ece=_ece(bins),
        bins=tuple(bins),
    )


@dataclass(frozen=True)
class PredictorEvaluation:
    """A predictor's held-out scores: ``groups[group][variant]``, groups :data:`ALL` and
    each stage seen, variants :data:`VARIANTS`."""

    hardware: str
    groups: dict[str, dict[str, Scores]]

    @property
    def overall(self) -> Scores:
        return self.groups[ALL][SHRUNK]

    def stages(self) -> list[str]:
        return [g for g in self.groups if g != ALL]

    def to_dict(self) -> dict[str, object]:
        """Nested, JSON-ready (``metrics/predictor.json``, the saved predictor)."""
        return {
            "hardware": self.hardware,
            "rows": self.groups[ALL][SHRUNK].rows,
            **{v: self.groups[ALL][v].to_dict() for v in VARIANTS},
            "by_stage": {
                stage: {v: self.groups[stage][v].to_dict() for v in VARIANTS}
                for stage in self.stages()
            },
        }

    def flat(self) -> dict[str, float]:
        """As the registry logs them (it prefixes ``<target>/``): ``auc``, ``brier``,
        ``ece``, ``rows``, ``raw/<metric>``, and ``<stage>/...`` likewise. An undefined
        AUC is left out."""
        out: dict[str, float] = {}
        for group, variants in self.groups.items():
            for variant, scores in variants.items():
                prefix = "/".join(p for p in (group, variant) if p not in (ALL, SHRUNK))
                values = {name: getattr(scores, name) for name in METRIC_NAMES}
                if variant == SHRUNK:
                    values["rows"] = scores.rows
                for name, value in values.items():
                    if value is not None:
                        out[f"{prefix}/{name}" if prefix else name] = float(value)
        return out

    def reliability_rows(self) -> list[dict[str, object]]:
        """The reliability diagram as plot data: one row per group, variant and bin."""
        return [
            {
                "group": group,
                "variant": variant,
                "bin": f"{b.lower:.1f}-{b.upper:.1f}",
                "predicted": round(b.predicted, 6),
                "observed": round(b.observed, 6),
                "rows": b.rows,
            }
            for group, variants in self.groups.items()
            for variant, scores in variants.items()
            for b in scores.bins
        ]

    def table(self) -> str:
        """One line per group: rows, base rate, and each metric shrunk / raw."""

        def pair(name: str, group: str) -> str:
            values = [getattr(self.groups[group][v], name) for v in VARIANTS]
            return " / ".join("  n/a" if x is None else f"{x:.3f}" for x in values)

        lines = [
            f"held-out drafted tokens on {self.hardware}: metric = shrunk / raw MLP",
            f"{'group':<8} {'rows':>7} {'accepted':>8}  {'AUC':^13}  {'Brier':^13}  {'ECE':^13}",
        ]
        for group in self.groups:
            scores = self.groups[group][SHRUNK]
            lines.append(
                f"{group:<8} {scores.rows:>7} {scores.observed:>8.3f}  {pair('auc', group):^13}"
                f"  {pair('brier', group):^13}  {pair('ece', group):^13}"
            )
        return "\n".join(lines)


def evaluate_predictor(predictor: AcceptancePredictor, rows: LabelledRows) -> PredictorEvaluation:
    """Score ``predictor`` on ``rows``, shrunk and raw, overall and per stage."""
    if not len(rows):
        raise ValueError("no rows to evaluate on")
    raw = predictor.raw(rows.features)  # [rows]
    shrunk = predictor.shrinkage.apply(rows.features, raw)  # [rows]
    predictions = {SHRUNK: shrunk, RAW: raw}
    members: dict[str, list[int]] = {ALL: list(range(len(rows)))}
    for i, row in enumerate(rows.features):
        members.setdefault(row.stage, []).append(i)
    groups = {}
    for group in [ALL, *sorted(g for g in members if g != ALL)]:
        index = torch.tensor(members[group], dtype=torch.int64)
        labels = [rows.labels[i] for i in members[group]]
        groups[group] = {v: score(labels, predictions[v][index].tolist()) for v in VARIANTS}
    return PredictorEvaluation(predictor.hardware, groups)
