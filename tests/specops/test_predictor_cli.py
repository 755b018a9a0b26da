"""``specops predictor train`` and ``evaluate`` through the Typer app, on a dataset of the
tiny target's detailed records; bad input exits 2 with one line and no traceback."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from registry.client import CHALLENGER, Registry
from registry.config import load_registry_config
from registry.predictor import predictor_by_alias
from specops.cli import app
from tests.tasks.train.predictor_records import engine_records, relabel, write_parts

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


def _invoke(*args: object):
    return runner.invoke(app, ["predictor", *map(str, args)])


@pytest.fixture(scope="module")
def records(target) -> list[dict]:
    return engine_records(target, prompts=8)


@pytest.fixture(scope="module")
def dataset(records, tmp_path_factory):
    return write_parts(records, tmp_path_factory.mktemp("dataset"))


def _failed(result, fragment: str) -> None:
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr, result.stderr
    assert "Traceback" not in result.output


def test_train_prints_the_table_and_writes_every_file(dataset, tmp_path):
    out, files = tmp_path / "predictor", tmp_path / "files"
    result = _invoke(
        "train", "--dataset", dataset, "--out", out, "--hardware", "cpu", "--epochs", 20,
        "--seed", 1, "--metrics", files / "m.json", "--plot", files / "r.png",
        "--plot-data", files / "r.json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "held-out drafted tokens on cpu" in result.stdout and "AUC" in result.stdout
    assert "epoch 1/20" not in result.stdout  # progress goes to stderr
    assert "epoch 1/20" in result.stderr and f"predictor: {out}" in result.stderr
    metrics = json.loads((files / "m.json").read_text())
    assert metrics["settings"]["seed"] == 1 and metrics["training"]["epochs"] <= 20
    assert (out / "predictor.json").is_file() and (files / "r.png").is_file()
    assert json.loads((files / "r.json").read_text())

    shown = _invoke("evaluate", out, "--dataset", dataset, "--metrics", files / "again.json")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[0] == result.stdout.splitlines()[0]
    assert json.loads((files / "again.json").read_text()) == metrics["heldout"]
    _failed(
        _invoke("evaluate", out, "--dataset", dataset, "--hardware", "cpu-int8"),
        "trained for hardware target 'cpu', not 'cpu-int8'",
    )


def test_settings_come_from_the_params_file_and_options_override_them(dataset, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"predictor": {"epochs": 3, "minutes": None, "seed": 4}}))
    args = ["train", "--dataset", dataset, "--out", tmp_path / "p", "--params", params]
    result = _invoke(*args, "--metrics", tmp_path / "m.json", "--epochs", 2)
    assert result.exit_code == 0, result.output
    settings = json.loads((tmp_path / "m.json").read_text())["settings"]
    assert (settings["epochs"], settings["seed"], settings["minutes"]) == (2, 4, None)
    params.write_text(yaml.safe_dump({"predictor": {"hiden": 8}}))
    _failed(_invoke(*args), "predictor.hiden")


def test_register_makes_a_challenger_of_the_target(dataset, tmp_path, monkeypatch, mlflow_uri):
    monkeypatch.setenv("SPECOPS_MLFLOW_URI", mlflow_uri)
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", str(tmp_path / "artifacts"))
    args = ["train", "--dataset", dataset, "--out", tmp_path / "p", "--epochs", 5, "--register"]
    result = _invoke(*args)
    assert result.exit_code == 0, result.output
    assert "registered specops-predictor/1 as challenger-cpu" in result.stderr
    version = predictor_by_alias(Registry(load_registry_config()), CHALLENGER, "cpu")
    assert version is not None and version.evaluated_on("cpu")
    assert version.tags["data_version"].startswith("dataset:") and version.tags["git_commit"]


def test_only_version_1_records_ask_for_detailed_v2_collection(records, tmp_path):
    old = [
        {**{k: v for k, v in r.items() if k not in ("drafted", "unverified")}, "schema_version": 1}
        for r in records
    ]
    dataset = write_parts(old, tmp_path / "dataset")
    _failed(
        _invoke("train", "--dataset", dataset, "--out", tmp_path / "p"),
        "collect in detailed mode with schema v2",
    )
    assert not (tmp_path / "p").exists()


def test_one_label_only_is_refused(records, tmp_path):
    dataset = write_parts(relabel(records, lambda row: True), tmp_path / "dataset")
    _failed(_invoke("train", "--dataset", dataset, "--out", tmp_path / "p"), "both outcomes")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--hardware", "nope"], "unknown hardware target 'nope'"),
        (["--epochs", 0], "bad settings: epochs"),
        (["--minutes", -1], "bad settings: minutes"),
    ],
)
def test_bad_options_exit_2(dataset, tmp_path, args, fragment):
    _failed(_invoke("train", "--dataset", dataset, "--out", tmp_path / "p", *args), fragment)


def test_a_missing_dataset_says_how_to_build_it(tmp_path):
    _failed(
        _invoke("train", "--dataset", tmp_path / "none", "--out", tmp_path / "p"),
        "build the dataset first",
    )
    _failed(
        _invoke("evaluate", tmp_path / "none", "--dataset", tmp_path),
        "is not a predictor folder",
    )
