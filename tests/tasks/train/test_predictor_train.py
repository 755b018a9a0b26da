"""Training the acceptance predictor on detailed records of the tiny target: saved, loaded
and scored the same; seeded; stops early or on its budget; learns a signal it is given;
refuses an unknown hardware target before reading anything."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from serving.engine.predictor import PredictorError, load_predictor
from serving.errors import BadInputError
from serving.hardware import hardware_target
from tasks.data.params import PredictorParams
from tasks.train.predictor import (
    evaluate_saved_predictor,
    fit_predictor,
    standardisation,
    train_predictor,
)
from tasks.train.predictor_data import heldout_rows, training_rows
from tasks.train.predictor_metrics import RAW, SHRUNK
from tests.tasks.train.predictor_records import engine_records, relabel, write_parts

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = PredictorParams(epochs=60, minutes=None, patience=8)
CPU = hardware_target("cpu")


@pytest.fixture(scope="module")
def records(target) -> list[dict]:
    return engine_records(target)


@pytest.fixture(scope="module")
def dataset(records, tmp_path_factory):
    return write_parts(records, tmp_path_factory.mktemp("dataset"))


@pytest.fixture(scope="module")
def trained(dataset, tmp_path_factory):
    folder = tmp_path_factory.mktemp("trained")
    result = train_predictor(
        dataset,
        folder / "predictor",
        hardware=hardware_target("cpu"),
        settings=FAST,
        metrics_path=folder / "metrics.json",
        plot=folder / "reliability.png",
        plot_data=folder / "reliability.json",
        progress=False,
    )
    return result, folder


def test_the_engine_records_carry_both_labels_and_both_stages(records):
    rows = [row for record in records for row in record["drafted"]]
    assert {row["stage"] for row in rows} == {"pld", "ngram"}
    assert 0 < sum(row["accepted"] for row in rows) < len(rows)


def test_trained_saved_loaded_and_scored_alike(trained, dataset):
    result, folder = trained
    loaded = load_predictor(result.folder, hardware=hardware_target("cpu"))
    rows = heldout_rows(dataset, hardware=CPU)
    assert torch.equal(loaded.predict(rows.features), result.predictor.predict(rows.features))
    assert torch.equal(loaded.raw(rows.features), result.predictor.raw(rows.features))
    assert loaded.stages == ("ngram", "pld") and loaded.hidden == FAST.hidden
    assert loaded.metrics == json.loads(json.dumps(result.metrics))
    saved = json.loads((folder / "metrics.json").read_text())
    assert saved == loaded.metrics
    assert saved["heldout"]["rows"] == len(rows)
    assert set(saved["heldout"]["by_stage"]) == {"ngram", "pld"}
    assert saved["data"]["train"]["parts"] == ["trainable"]
    assert saved["training"]["stopped"] in ("early stopping", "epochs")
    again = evaluate_saved_predictor(result.folder, dataset, hardware=hardware_target("cpu"))
    assert again.to_dict() == result.evaluation.to_dict()


def test_the_plot_and_its_data_are_written(trained):
    result, folder = trained
    assert (folder / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plotted = json.loads((folder / "reliability.json").read_text())
    assert plotted == result.evaluation.reliability_rows()
    assert {row["group"] for row in plotted} == {"all", "ngram", "pld"}


def test_it_learns_the_acceptance_rate(trained):
    """On the tiny random target few drafts are accepted; the predictor learns so (a
    constant 0.5 would score Brier 0.25)."""
    result, _ = trained
    for variant in (SHRUNK, RAW):
        overall = result.evaluation.groups["all"][variant]
        assert overall.brier < 0.2
        assert abs(overall.predicted - overall.observed) < 0.1


def test_it_learns_a_separable_signal(records, tmp_path):
    """Labels made by construction from one real feature (tests only): the held-out AUC
    shows the MLP learns the rule."""
    logprobs = [row["recent_logprob"] for record in records for row in record["drafted"]]
    cut = statistics.median(logprobs)
    dataset = write_parts(relabel(records, lambda row: row["recent_logprob"] > cut), tmp_path)
    result = train_predictor(
        dataset,
        tmp_path / "predictor",
        hardware=hardware_target("cpu"),
        settings=FAST,
        progress=False,
    )
    assert result.evaluation.groups["all"][RAW].auc > 0.9
    assert result.evaluation.groups["all"][SHRUNK].auc > 0.8


def test_the_same_seed_gives_the_same_predictor(dataset):
    rows = training_rows(dataset, hardware=CPU)
    first, second = (fit_predictor(rows, FAST, hardware=CPU, progress=False) for _ in "ab")
    other = fit_predictor(rows, FAST.model_copy(update={"seed": 1}), hardware=CPU, progress=False)
    for name, weight in first.predictor.mlp.state_dict().items():
        assert torch.equal(weight, second.predictor.mlp.state_dict()[name])
    assert not torch.equal(
        first.predictor.mlp.state_dict()["0.weight"], other.predictor.mlp.state_dict()["0.weight"]
    )
    assert first.predictor.shrinkage == second.predictor.shrinkage


def test_it_stops_early_and_on_its_budget(dataset, capsys):
    rows = training_rows(dataset, hardware=CPU)
    early = fit_predictor(rows, PredictorParams(patience=1, minutes=None), hardware=CPU)
    assert early.stopped == "early stopping" and len(early.history) < 200
    assert early.history[-1].epoch == early.best_epoch + 1
    lines = capsys.readouterr().err
    assert "epoch 1/200" in lines and "stopped after epoch" in lines and "(early stopping)" in lines
    budget = fit_predictor(rows, PredictorParams(minutes=1e-9), hardware=CPU, progress=False)
    assert budget.stopped == "time budget" and len(budget.history) == 1


def test_the_shrinkage_is_fitted_on_every_training_row(dataset):
    rows = training_rows(dataset, hardware=CPU)
    fitted = fit_predictor(rows, FAST, hardware=CPU, progress=False)
    assert sum(fitted.predictor.shrinkage.counts.values()) == len(rows)
    assert set(fitted.predictor.shrinkage.stage_prior) == {"ngram", "pld"}
    assert fitted.fit_rows + fitted.validation_rows == len(rows)


def test_a_constant_feature_is_not_scaled_up():
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    mean, std = standardisation(x)
    assert mean.tolist() == [2.0, 0.0] and std.tolist() == [1.0, 1.0]


def test_an_unknown_hardware_target_fails_first(tmp_path):
    with pytest.raises(BadInputError, match=r"unknown hardware target 'tpu-v9'; known: \["):
        train_predictor(tmp_path / "nothing", tmp_path / "out", hardware=hardware_target("tpu-v9"))
    assert not (tmp_path / "out").exists()


def test_a_predictor_for_another_target_is_refused(trained, dataset):
    result, _ = trained
    with pytest.raises(PredictorError, match="trained for hardware target 'cpu', not 'cpu-int8'"):
        evaluate_saved_predictor(result.folder, dataset, hardware=hardware_target("cpu-int8"))


def test_a_retrain_replaces_the_folder_whole(dataset, tmp_path):
    out = tmp_path / "predictor"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    train_predictor(dataset, out, hardware=hardware_target("cpu"), settings=FAST, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["predictor.json", "predictor.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["predictor"]  # no temporaries left
