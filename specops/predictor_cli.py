"""``specops predictor ...``: train the acceptance predictor on the validated dataset,
evaluate a saved one (the work is in :mod:`tasks.train.predictor`; the registry's side in
:mod:`registry.predictor`). Progress goes to stderr, the metrics table to stdout; bad input
(no drafted rows, one label only, an unknown hardware target) exits 2 with one line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from serving.hardware import DEFAULT_HARDWARE
from specops.exit import failing

predictor_app = typer.Typer(help="The acceptance predictor: train, evaluate.")


@predictor_app.command("train")
def train(
    dataset: Annotated[
        Path, typer.Option(help="The dataset folder (`specops data validate --out`).")
    ],
    out: Annotated[Path, typer.Option(help="The predictor folder to write (replaced whole).")],
    hardware: Annotated[
        str, typer.Option(help="Hardware target (configs/hardware.yaml): its records only.")
    ] = DEFAULT_HARDWARE,
    params: Annotated[
        Path | None,
        typer.Option(help="Take the settings from this params file's `predictor` section."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (default: params, else 0).")] = None,
    epochs: Annotated[int | None, typer.Option(help="At most this many epochs.")] = None,
    minutes: Annotated[
        float | None, typer.Option(help="Wall-clock budget of the epochs, in minutes.")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the reliability diagram (PNG).")] = None,
    plot_data: Annotated[
        Path | None, typer.Option(help="Write the reliability diagram's data (JSON rows).")
    ] = None,
    metrics: Annotated[Path | None, typer.Option(help="Write the metrics (JSON).")] = None,
    register: Annotated[
        bool,
        typer.Option(
            "--register", help="Register it in MLflow (specops-predictor) as challenger-HW."
        ),
    ] = False,
) -> None:
    """Train the acceptance predictor for one hardware target, score it on the held-out
    parts, save it to OUT."""
    from serving.hardware import hardware_target
    from tasks.data.params import PredictorParams, load_params
    from tasks.train.predictor import train_predictor

    with failing(settings=True):
        base = load_params(params).predictor if params is not None else PredictorParams()
        overrides = {"seed": seed, "epochs": epochs, "minutes": minutes}
        settings = PredictorParams.model_validate(
            {**base.model_dump(), **{k: v for k, v in overrides.items() if v is not None}}
        )
    with failing():
        trained = train_predictor(
            dataset,
            out,
            hardware=hardware_target(hardware),  # an unknown target fails before any reading
            settings=settings,
            metrics_path=metrics,
            plot=plot,
            plot_data=plot_data,
        )
        label = _register(trained, dataset, hardware) if register else None
    typer.echo(trained.evaluation.table())
    written = [f"predictor: {out}"] + [
        f"{name}: {path}"
        for name, path in (("metrics", metrics), ("plot", plot), ("plot data", plot_data))
        if path is not None
    ]
    typer.echo("; ".join(written), err=True)
    if label is not None:
        typer.echo(f"registered {label} as challenger-{hardware}", err=True)


def _register(trained, dataset: Path, hardware: str) -> str:
    from registry.client import Registry
    from registry.predictor import log_predictor, set_predictor_challenger
    from tasks.loop.lineage import git_commit
    from tasks.train.predictor_data import HELDOUT_PARTS, TRAIN_PARTS, dataset_version

    registry = Registry()
    version = log_predictor(
        registry,
        trained.folder,
        metrics=trained.evaluation.flat(),
        params=trained.params(),
        tags={
            "data_version": dataset_version(dataset, TRAIN_PARTS + HELDOUT_PARTS),
            "git_commit": git_commit(),
        },
        curves=trained.curves(),
    )
    set_predictor_challenger(registry, version, hardware)
    return version.label


@predictor_app.command("evaluate")
def evaluate(
    predictor: Annotated[Path, typer.Argument(help="A predictor folder (predictor.json).")],
    dataset: Annotated[Path, typer.Option(help="The dataset folder: its held-out parts.")],
    hardware: Annotated[
        str | None, typer.Option(help="Refuse a predictor trained for another target.")
    ] = None,
    metrics: Annotated[Path | None, typer.Option(help="Write the metrics (JSON).")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the reliability diagram (PNG).")] = None,
) -> None:
    """Score a saved predictor on the held-out parts of a dataset (shrunk and raw)."""
    from serving.atomic import write_json_atomic
    from serving.hardware import hardware_target
    from tasks.train.predictor import evaluate_saved_predictor
    from tasks.train.predictor_plot import write_reliability_plot

    with failing():
        expected = None if hardware is None else hardware_target(hardware)
        evaluation = evaluate_saved_predictor(predictor, dataset, hardware=expected)
    if metrics is not None:
        write_json_atomic(metrics, evaluation.to_dict())
    if plot is not None:
        write_reliability_plot(evaluation, plot)
    typer.echo(evaluation.table())
