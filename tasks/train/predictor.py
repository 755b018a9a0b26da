"""Train, evaluate and save the acceptance predictor (:mod:`serving.engine.predictor`).

:func:`train_predictor` reads the dataset's training rows and held-out rows of one hardware
target (:mod:`tasks.train.predictor_data`; both are checked before any training), then:

1. :func:`fit_predictor`: the MLP (:func:`~serving.engine.predictor.make_mlp`) on the features
   standardised with the fitting rows' mean and standard deviation, binary cross-entropy
   and Adam, in seeded minibatch epochs until ``epochs``, the ``minutes`` budget, or
   ``patience`` epochs without a better loss on a validation slice of the training
   requests (early stopping; the best epoch's weights are kept). Then the shrinkage
   (:class:`~serving.engine.predictor.Shrinkage`) is fitted on every training row with the trained
   MLP's raw scores;
2. :func:`~tasks.train.predictor_metrics.evaluate_predictor` on the held-out rows: AUC,
   Brier score and ECE, overall and per stage, shrunk and raw;
3. the predictor folder (written whole and atomically), with those metrics inside, and on
   request the metrics file, the reliability plot data (JSON) and the diagram (PNG).

The same data and settings give the same predictor. Settings are
:class:`tasks.data.params.PredictorParams` (``params.yaml``'s ``predictor`` section).
"""

from __future__ import annotations

import copy
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from serving.atomic import atomic_dir, write_json_atomic
from serving.engine.features import FEATURE_SET
from serving.engine.predictor import (
    FEATURE_NAMES,
    AcceptancePredictor,
    Shrinkage,
    load_predictor,
    make_mlp,
    vectorize,
)
from serving.errors import BadInputError
from serving.hardware import HardwareTarget, hardware_target
from tasks.data.params import PredictorParams
from tasks.train.predictor_data import (
    HELDOUT_PARTS,
    TRAIN_PARTS,
    LabelledRows,
    heldout_rows,
    training_rows,
    validation_split,
)
from tasks.train.predictor_metrics import PredictorEvaluation, evaluate_predictor
from tasks.train.predictor_plot import write_reliability_plot

LOG_EVERY = 5  # epochs between progress lines
StopReason = Literal["early stopping", "epochs", "time budget"]


@dataclass(frozen=True)
class EpochPoint:
    epoch: int  # 1-based
    train_loss: float  # mean binary cross-entropy over the epoch's fitting rows
    validation_loss: float | None  # on the validation slice (None without one)
    seconds: float  # since training started


@dataclass(frozen=True)
class FitResult:
    predictor: AcceptancePredictor
    history: list[EpochPoint]
    best_epoch: int  # whose weights were kept
    stopped: StopReason
    fit_rows: int
    validation_rows: int
    seconds: float

    def summary(self) -> dict[str, Any]:
        last = self.history[-1]
        best = self.history[self.best_epoch - 1]
        return {
            "epochs": last.epoch,
            "best_epoch": self.best_epoch,
            "stopped": self.stopped,
            "seconds": round(self.seconds, 2),
            "fit_rows": self.fit_rows,
            "validation_rows": self.validation_rows,
            "train_loss": best.train_loss,
            "validation_loss": best.validation_loss,
        }


def _say(progress: bool, line: str) -> None:
    if progress:
        print(line, file=sys.stderr, flush=True)


def standardisation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature mean and standard deviation of ``x`` ``[rows, features]``; a constant
    feature (a stage never seen, say) gets 1, so that a new value does not explode."""
    mean = x.mean(dim=0)
    std = x.std(dim=0, unbiased=False)
    return mean, torch.where(std < 1e-6, torch.ones_like(std), std)


def _bce(mlp: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(nn.functional.binary_cross_entropy_with_logits(mlp(x)[:, 0], y))


def _train_epoch(
    mlp: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,  # [rows, features], standardised
    y: torch.Tensor,  # [rows] 1.0 = accepted
    batch_size: int,
    generator: torch.Generator,
) -> float:
    """One pass over the rows in seeded minibatches; the mean binary cross-entropy."""
    mlp.train()
    order = torch.randperm(len(y), generator=generator)
    total = 0.0
    for start in range(0, len(y), batch_size):
        batch = order[start : start + batch_size]
        logits = mlp(x[batch])[:, 0]  # [batch]
        loss = nn.functional.binary_cross_entropy_with_logits(logits, y[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += float(loss.detach()) * len(batch)
    mlp.eval()
    return total / len(y)


def fit_predictor(
    rows: LabelledRows,
    settings: PredictorParams,
    *,
    hardware: HardwareTarget,
    progress: bool = True,
    log_every: int = LOG_EVERY,
) -> FitResult:
    """Train the MLP on ``rows`` for ``hardware`` and fit its shrinkage (see the module
    docstring)."""
    if not len(rows):
        raise BadInputError("no rows to train the predictor on")
    started = time.perf_counter()
    fit, validation = validation_split(rows, settings.validation_fraction, seed=settings.seed)
    x_fit = vectorize(fit.features)  # [fit, features]
    mean, std = standardisation(x_fit)
    x_fit = (x_fit - mean) / std
    y_fit = torch.tensor(fit.labels, dtype=torch.float32)  # [fit]
    x_val = (vectorize(validation.features) - mean) / std  # [validation, features]
    y_val = torch.tensor(validation.labels, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        mlp = make_mlp(len(FEATURE_NAMES), settings.hidden)
    generator = torch.Generator().manual_seed(settings.seed)
    optimizer = torch.optim.Adam(mlp.parameters(), lr=settings.learning_rate)
    deadline = None if settings.minutes is None else started + settings.minutes * 60.0
    _say(
        progress,
        f"predictor ({hardware.name}): {len(fit)} fitting rows, {len(validation)} validation rows "
        f"(from {len(set(validation.groups))} of the requests); up to {settings.epochs} epochs"
        + ("" if settings.minutes is None else f" or {settings.minutes:g} min"),
    )
    history: list[EpochPoint] = []
    best_loss, best_epoch, best_state = math.inf, 0, copy.deepcopy(mlp.state_dict())
    stopped: StopReason = "epochs"
    for epoch in range(1, settings.epochs + 1):
        train_loss = _train_epoch(mlp, optimizer, x_fit, y_fit, settings.batch_size, generator)
        if not math.isfinite(train_loss):
            raise FloatingPointError(
                f"the predictor's training loss became {train_loss} in epoch {epoch}; lower "
                f"learning_rate (now {settings.learning_rate})"
            )
        val_loss = _bce(mlp, x_val, y_val) if len(validation) else None
        history.append(EpochPoint(epoch, train_loss, val_loss, time.perf_counter() - started))
        watched = train_loss if val_loss is None else val_loss
        if watched < best_loss - 1e-6:
            best_loss, best_epoch, best_state = watched, epoch, copy.deepcopy(mlp.state_dict())
        if epoch == 1 or epoch % log_every == 0:
            shown = "n/a" if val_loss is None else f"{val_loss:.4f}"
            _say(
                progress,
                f"  epoch {epoch}/{settings.epochs}: train loss {train_loss:.4f}, validation "
                f"loss {shown} (best epoch {best_epoch}), {history[-1].seconds:.1f} s",
            )
        if val_loss is not None and epoch - best_epoch >= settings.patience:
            stopped = "early stopping"
            break
        if deadline is not None and time.perf_counter() >= deadline:
            stopped = "time budget"
            break
    mlp.load_state_dict(best_state)
    mlp.eval()
    predictor = AcceptancePredictor(
        mlp,
        mean=mean,
        std=std,
        shrinkage=Shrinkage(settings.shrinkage_strength),
        hardware=hardware.name,
        stages=rows.stages(),
        hidden=settings.hidden,
    )
    predictor.shrinkage = Shrinkage.fit(
        rows.features,
        predictor.raw(rows.features),
        rows.labels,
        strength=settings.shrinkage_strength,
    )
    seconds = time.perf_counter() - started
    _say(
        progress,
        f"  stopped after epoch {history[-1].epoch} ({stopped}); kept epoch {best_epoch}; "
        f"{seconds:.1f} s",
    )
    return FitResult(predictor, history, best_epoch, stopped, len(fit), len(validation), seconds)


@dataclass(frozen=True)
class TrainedPredictor:
    folder: Path  # the saved predictor (serving.engine.predictor.load_predictor reads it)
    predictor: AcceptancePredictor
    fit: FitResult
    evaluation: PredictorEvaluation  # on the held-out rows
    settings: PredictorParams
    metrics: dict[str, Any]  # as saved in the folder and written to the metrics file

    def params(self) -> dict[str, Any]:
        """What a registered version logs as its run's parameters."""
        return {
            "hardware": self.predictor.hardware,
            "feature_set": FEATURE_SET,
            **self.settings.model_dump(),
            **{k: v for k, v in self.fit.summary().items() if k in ("fit_rows", "epochs")},
        }

    def curves(self) -> dict[str, list[tuple[int, float]]]:
        """Loss per epoch, ``name -> [(epoch, value)]`` (the registry's curve format)."""
        curves: dict[str, list[tuple[int, float]]] = {"train/loss": []}
        for point in self.fit.history:
            curves["train/loss"].append((point.epoch, point.train_loss))
            if point.validation_loss is not None:
                curves.setdefault("validation/loss", []).append(
                    (point.epoch, point.validation_loss)
                )
        return curves


def _rows_summary(rows: LabelledRows, parts: tuple[str, ...]) -> dict[str, Any]:
    return {
        "parts": list(parts),
        "records": rows.records_here,
        "requests_with_rows": len(set(rows.groups)),
        "rows": len(rows),
        "accepted": rows.accepted,
    }


def train_predictor(
    dataset_dir: str | Path,
    out_dir: str | Path,
    *,
    hardware: HardwareTarget,
    settings: PredictorParams | None = None,
    metrics_path: str | Path | None = None,
    plot: str | Path | None = None,
    plot_data: str | Path | None = None,
    progress: bool = True,
) -> TrainedPredictor:
    """Train a predictor for ``hardware`` on ``dataset_dir`` (its records collected there),
    evaluate it on the held-out parts, save it to ``out_dir`` (replaced whole) and write
    the optional outputs."""
    settings = settings or PredictorParams()
    train = training_rows(dataset_dir, hardware=hardware)
    heldout = heldout_rows(dataset_dir, hardware=hardware)
    fitted = fit_predictor(train, settings, hardware=hardware, progress=progress)
    evaluation = evaluate_predictor(fitted.predictor, heldout)
    metrics: dict[str, Any] = {
        "hardware": hardware.name,
        "feature_set": FEATURE_SET,
        "data": {
            "train": _rows_summary(train, TRAIN_PARTS),
            "heldout": _rows_summary(heldout, HELDOUT_PARTS),
        },
        "settings": settings.model_dump(),
        "training": fitted.summary(),
        "heldout": evaluation.to_dict(),
    }
    fitted.predictor.metrics = metrics
    with atomic_dir(out_dir) as scratch:
        fitted.predictor.save(scratch)
    if metrics_path is not None:
        write_json_atomic(metrics_path, metrics)
    if plot_data is not None:
        write_json_atomic(plot_data, evaluation.reliability_rows())
    if plot is not None:
        write_reliability_plot(evaluation, plot)
    return TrainedPredictor(Path(out_dir), fitted.predictor, fitted, evaluation, settings, metrics)


def evaluate_saved_predictor(
    folder: str | Path, dataset_dir: str | Path, *, hardware: HardwareTarget | None = None
) -> PredictorEvaluation:
    """A saved predictor's scores on the held-out parts of ``dataset_dir`` (the rows of
    the hardware target it was trained for; ``hardware``, when given, must be that one)."""
    predictor = load_predictor(folder, hardware=hardware)
    trained_for = hardware_target(predictor.hardware)  # refused unless a known target
    return evaluate_predictor(predictor, heldout_rows(dataset_dir, hardware=trained_for))
