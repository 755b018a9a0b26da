"""The acceptance predictor's registered model against a real MLflow SQLite store: versions
with metrics keyed by target and lineage tags, aliases per target, promotion refusals, the
champion's folder; kept apart from the draft families and their rollback."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from registry.client import CHALLENGER, RegistryError
from registry.config import RegistryConfig
from registry.predictor import (
    champion_predictor,
    download_champion_predictor,
    download_predictor,
    get_predictor,
    log_predictor,
    predictor_by_alias,
    promote_predictor,
    set_predictor_challenger,
)
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.predictor import (
    FEATURE_NAMES,
    AcceptancePredictor,
    PredictorError,
    Shrinkage,
    load_predictor,
    make_mlp,
)
from serving.hardware import hardware_target

METRICS = {"auc": 0.71, "brier": 0.18, "ece": 0.04, "raw/ece": 0.06, "pld/auc": 0.69}
LINEAGE = {"data_version": "dataset:0123456789abcdef", "git_commit": "abc123"}


@pytest.fixture
def saved(tmp_path):
    """``saved(hardware, seed=0)``: a predictor folder (random weights) for ``hardware``."""

    def save(hardware: str = "cpu", seed: int = 0):
        torch.manual_seed(seed)
        predictor = AcceptancePredictor(
            make_mlp(len(FEATURE_NAMES), 8),
            mean=torch.zeros(len(FEATURE_NAMES)),
            std=torch.ones(len(FEATURE_NAMES)),
            shrinkage=Shrinkage(5.0, {"pld/0/3": 4}, {"pld": 0.3}, 0.4),
            hardware=hardware,
            stages=("pld",),
            hidden=8,
        )
        return predictor.save(tmp_path / f"predictor-{hardware}-{seed}")

    return save


def test_a_version_carries_its_target_metrics_and_lineage(registry, saved):
    version = log_predictor(
        registry, saved(), metrics=METRICS, params={"epochs": 30}, tags=LINEAGE,
        curves={"train/loss": [(1, 0.7), (2, 0.6)]},
    )  # fmt: skip
    assert version.label == "specops-predictor/1" and version.family == "predictor"
    assert version.evaluated_on("cpu") and not version.evaluated_on("cpu-int8")
    assert version.tags["data_version"] == LINEAGE["data_version"]
    assert version.tags["git_commit"] == "abc123" and version.tags["hardware"] == "cpu"
    assert version.tags["cpu/auc"] == repr(0.71)
    run = registry.client.get_run(version.run_id)
    assert run.data.metrics == {f"cpu/{k}": v for k, v in METRICS.items()} | {"train/loss": 0.6}
    assert run.data.params["epochs"] == "30" and run.data.tags["kind"] == "predictor"
    assert run.data.tags["data_version"] == LINEAGE["data_version"]
    assert registry.families() == []  # never taken for a draft family


def test_a_broken_folder_never_gets_a_version(registry, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PredictorError, match="not a predictor folder"):
        log_predictor(registry, tmp_path / "empty", metrics=METRICS)
    with pytest.raises(RegistryError, match="has no version '1'"):
        get_predictor(registry, 1)


def test_aliases_are_per_target(registry, saved, tmp_path):
    cpu = log_predictor(registry, saved("cpu"), metrics=METRICS)
    int8 = log_predictor(registry, saved("cpu-int8"), metrics=METRICS)
    assert download_champion_predictor(registry, "cpu", tmp_path / "cache") is None
    set_predictor_challenger(registry, cpu, "cpu")
    set_predictor_challenger(registry, int8, "cpu-int8")
    promote_predictor(registry, cpu, "cpu", reason="better held-out AUC")
    promote_predictor(registry, int8, "cpu-int8", reason="first")
    assert predictor_by_alias(registry, CHALLENGER, "cpu").version == cpu.version
    assert champion_predictor(registry, "cpu").version == cpu.version
    assert champion_predictor(registry, "cpu-int8").version == int8.version
    assert champion_predictor(registry, "cpu-int4") is None
    folder = download_champion_predictor(registry, "cpu-int8", tmp_path / "cache")
    on_int8 = hardware_target("cpu-int8")
    assert folder is not None and load_predictor(folder, hardware=on_int8).hardware == "cpu-int8"
    assert download_predictor(registry, int8, tmp_path / "cache") == folder  # reused
    # A draft promotion's rollback never reads a predictor promotion.
    with pytest.raises(RegistryError, match="no promotion on 'cpu' to roll back"):
        registry.rollback("cpu")


def test_a_new_champion_replaces_the_old_on_its_target(registry, saved):
    first = log_predictor(registry, saved(seed=0), metrics=METRICS)
    second = log_predictor(registry, saved(seed=1), metrics=METRICS)
    promote_predictor(registry, first, "cpu", reason="first")
    with pytest.raises(RegistryError, match="moved from None to specops-predictor/1"):
        promote_predictor(registry, second, "cpu", reason="late", expected_champion=None)
    promote_predictor(registry, second, "cpu", reason="better", expected_champion=first.label)
    assert champion_predictor(registry, "cpu").version == second.version


def test_a_predictor_serves_only_its_own_target(registry, saved):
    version = log_predictor(registry, saved("cpu"), metrics=METRICS)
    with pytest.raises(RegistryError, match="trained for hardware target 'cpu', not 'cpu-int4'"):
        set_predictor_challenger(registry, version, "cpu-int4")
    with pytest.raises(RegistryError, match="trained for hardware target 'cpu', not 'cpu-int4'"):
        promote_predictor(registry, version, "cpu-int4", reason="wrong target")


def test_promotion_needs_held_out_metrics(registry, saved):
    version = log_predictor(registry, saved(), metrics={})
    assert not version.evaluated_on("cpu")
    with pytest.raises(RegistryError, match="has not been evaluated on 'cpu'"):
        promote_predictor(registry, version, "cpu", reason="unmeasured")


def test_the_predictor_and_the_drafts_do_not_mix(registry, saved, tmp_path):
    draft = registry.log_draft(
        write_package(tmp_path / "pkg", DraftManifest(drafter="pld:3")), family="x"
    )
    log_predictor(registry, saved(), metrics=METRICS)
    assert registry.families() == ["x"] and draft.name == "t-x"


def test_the_predictor_model_is_outside_the_draft_prefix():
    with pytest.raises(ValidationError, match="starts with the draft prefix"):
        RegistryConfig(model_prefix="specops", predictor_model="specops-predictor")
    assert RegistryConfig().predictor_model == "specops-predictor"
